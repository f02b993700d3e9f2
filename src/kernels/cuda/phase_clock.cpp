#include "kernels/cuda/phase_clock.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

class CudaPhaseClock final : public DevicePhaseClock {
 public:
  const char* name() const override { return "CUDA events on the backend's stream"; }

  // An event recorded in a stream being captured becomes part of the graph, not a time: a
  // captured phase is not marked.
  bool can_mark() const override { return !capturing(); }

  int64_t begin(Phase phase) override {
    if (used_ == marks_.size()) {
      Mark mark;
      MOE_CUDA_CHECK(cudaEventCreate(&mark.start));
      MOE_CUDA_CHECK(cudaEventCreate(&mark.end));
      marks_.push_back(mark);
    }
    Mark& mark = marks_[used_];
    mark.phase = phase;
    mark.state = State::kOpen;
    MOE_CUDA_CHECK(cudaEventRecord(mark.start, stream()));
    return static_cast<int64_t>(used_++);
  }

  // Unchecked calls (ScopedPhase's destructor calls this, also while an error unwinds): a
  // failure leaves the phase untimed, and the error, sticky or not, is the next checked call's.
  // A scope begun before a capture and ending inside it has no end to measure to: untimed too.
  void end(int64_t id) noexcept override {
    Mark& mark = marks_[static_cast<size_t>(id)];
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const bool recorded = cudaStreamIsCapturing(stream(), &status) == cudaSuccess &&
                          status == cudaStreamCaptureStatusNone &&
                          cudaEventRecord(mark.end, stream()) == cudaSuccess;
    mark.state = recorded ? State::kEnded : State::kDone;
  }

  void collect() override {
    bool open = false;
    for (size_t i = 0; i < used_; ++i) {
      Mark& mark = marks_[i];
      if (mark.state == State::kEnded) {
        // Each end waited for (marks end in any order; once the device is past the latest,
        // the others return at once).
        MOE_CUDA_CHECK(cudaEventSynchronize(mark.end));
        float ms = 0.0f;
        MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, mark.start, mark.end));
        phase_timer::add(mark.phase, 1e-3 * static_cast<double>(ms));
        mark.state = State::kDone;
      }
      open |= mark.state == State::kOpen;
    }
    // A mark still open (a scope around the caller) keeps its id until it ends: the marks are
    // reused only once none is.
    if (!open) used_ = 0;
  }

 private:
  enum class State : uint8_t { kOpen, kEnded, kDone };
  struct Mark {
    Phase phase = Phase::kCount;
    cudaEvent_t start = nullptr, end = nullptr;
    State state = State::kDone;
  };
  std::vector<Mark> marks_;  // the first used_ are this round's; the rest are events to reuse
  size_t used_ = 0;
};

}  // namespace

DevicePhaseClock& cuda_phase_clock() {
  static CudaPhaseClock clock;
  return clock;
}

}  // namespace moecore::kernels::cuda
