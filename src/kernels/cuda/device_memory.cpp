#include "kernels/cuda/device_memory.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

// Copies from host memory through pinned staging, so that the host need not wait for them: the
// caller's bytes go into a pinned slot at once (the caller may reuse its buffer on return), and
// the device copy from the slot is queued on the stream; a slot is reused once the copy queued
// from it last has completed (an event, rarely waited for: the ring holds kSlots copies in
// flight). Copies above kMaxStaged bytes (checkpoints, initial weights) wait as before: their
// pinned memory would outweigh the wait.
class PinnedStaging {
 public:
  static constexpr size_t kSlots = 16;
  static constexpr size_t kMaxStaged = size_t{16} << 20;

  // Whether `bytes` go through the staging.
  static bool stages(size_t bytes) { return bytes <= kMaxStaged; }

  void copy_to_device(void* dst, const void* src, size_t bytes) {
    Slot& slot = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (slot.in_flight) MOE_CUDA_CHECK(cudaEventSynchronize(slot.done));
    if (slot.bytes < bytes) {
      if (slot.pinned != nullptr) MOE_CUDA_CHECK(cudaFreeHost(slot.pinned));
      slot.pinned = nullptr;
      slot.bytes = 0;
      MOE_CUDA_CHECK(cudaMallocHost(&slot.pinned, bytes));
      slot.bytes = bytes;
    }
    if (slot.done == nullptr)
      MOE_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    std::memcpy(slot.pinned, src, bytes);
    MOE_CUDA_CHECK(cudaMemcpyAsync(dst, slot.pinned, bytes, cudaMemcpyHostToDevice, stream()));
    MOE_CUDA_CHECK(cudaEventRecord(slot.done, stream()));
    slot.in_flight = true;
  }

 private:
  struct Slot {
    void* pinned = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool in_flight = false;
  };
  std::array<Slot, kSlots> slots_{};
  size_t next_ = 0;
};

class CudaMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::kCuda; }

  void* allocate(size_t bytes) override {
    // An array allocated in a capture would be the graph's memory, gone or taken again at its
    // replays: a captured step finds its buffers allocated.
    MOE_CHECK(!capturing(),
              "[cuda] an allocation of {} bytes inside a CUDA graph's capture: a captured step "
              "must find its buffers allocated",
              bytes);
    void* data = nullptr;
    const cudaError_t status = cudaMallocAsync(&data, bytes, stream());
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it for the next call
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail("[cuda] out of device memory: {:.1f} MiB asked, {:.1f} MiB free of {:.1f} MiB",
           mib(bytes), mib(free_bytes), mib(total_bytes));
    }
    MOE_CUDA_CHECK(status);
    return data;
  }

  void deallocate(void* data, size_t /*bytes*/) noexcept override {
    // Inside a capture the buffer is kept until it ends (release_frees_inside_capture): there,
    // cudaFreeAsync would be a node of the graph, valid only for the graph's own allocations
    // (a destructor cannot throw here; CudaGraphs::end_capture fails on the count).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      try {
        const std::lock_guard lock(kept_mutex_);
        kept_in_capture_.push_back(data);
      } catch (...) {  // no memory for the list: the buffer leaks, the capture still fails
        ++lost_in_capture_;
      }
      return;
    }
    free_now(data);
  }

  int64_t release_frees_inside_capture() {
    const std::lock_guard lock(kept_mutex_);
    const auto freed = static_cast<int64_t>(kept_in_capture_.size()) + lost_in_capture_;
    for (void* data : kept_in_capture_) free_now(data);
    kept_in_capture_.clear();
    lost_in_capture_ = 0;
    return freed;
  }

  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) override {
    // A graph replays its copies from the addresses of the capture, not the caller's bytes of
    // the replay: a captured step finds its inputs in device memory, placed before the capture.
    MOE_CHECK(kind == CopyKind::kWithinDevice || !capturing(),
              "[cuda] a copy of {} bytes between host and device memory inside a CUDA graph's "
              "capture: place the inputs in device memory before capturing, read results after",
              bytes);
    // From the host: staged in pinned memory and queued, no wait (the stream orders it before
    // the kernels that read it).
    if (kind == CopyKind::kHostToDevice && PinnedStaging::stages(bytes)) {
      staging_.copy_to_device(dst, src, bytes);
      return;
    }
    MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
    // Host memory on either side is read or written before the call returns (a pageable
    // buffer's copy is not guaranteed to have left it earlier); a copy within the device is in
    // order with the stream's kernels, which are all that can see it, so it waits for nothing.
    if (kind != CopyKind::kWithinDevice) synchronize();
  }

  void zero(void* data, size_t bytes) override {
    MOE_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream()));
  }

 private:
  static double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
  // Stream-ordered: the memory returns to the pool once the work issued before is done. A
  // failure is left for nobody: cleared, so that the next launch check does not report it.
  static void free_now(void* data) noexcept {
    if (cudaFreeAsync(data, stream()) != cudaSuccess) cudaGetLastError();
  }
  PinnedStaging staging_;
  std::mutex kept_mutex_;
  std::vector<void*> kept_in_capture_;  // freed inside a capture, released after it
  int64_t lost_in_capture_ = 0;
};

CudaMemory& cuda_memory() {
  static CudaMemory memory;
  return memory;
}

}  // namespace

DeviceMemory& device_memory() {
  return cuda_memory();
}

int64_t release_frees_inside_capture() {
  return cuda_memory().release_frees_inside_capture();
}

}  // namespace moecore::kernels::cuda
