// train.profile's phases on the GPU (kernels/cuda/phase_clock.h): the clock gives a phase the time
// the backend's stream took to run its work, not the host's time to issue it, and marks nothing
// while the stream is captured into a graph.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "core/device_graph.h"
#include "core/phase_timer.h"
#include "kernels/cuda/cuda_graphs.h"
#include "kernels/cuda/phase_clock.h"
#include "kernels/cuda/runtime.h"

namespace moecore::cuda_phase_clock_test {
namespace {

// Work the stream takes 30 ms to run while the host only queues it: a host function on the
// stream, which the stream waits for.
void CUDART_CB sleep_30_ms(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

double total(Phase phase) {
  return phase_timer::totals()[static_cast<size_t>(phase)];
}

TEST(CudaPhaseClock, TimesWhatTheStreamRanNotWhatTheHostIssued) {
  kernels::cuda::synchronize();
  phase_timer::set_enabled(true);
  phase_timer::reset();
  phase_timer::set_device_clock(&kernels::cuda::cuda_phase_clock());
  EXPECT_STREQ(phase_timer::clock_name(), "CUDA events on the backend's stream");

  const auto issued = std::chrono::steady_clock::now();
  {
    const ScopedPhase phase(Phase::kExpertsForward);
    ASSERT_EQ(cudaLaunchHostFunc(kernels::cuda::stream(), sleep_30_ms, nullptr), cudaSuccess);
  }
  const double host_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - issued).count();
  // totals() waits for the device to pass the phase's end, then adds the events' time.
  const double device_seconds = total(Phase::kExpertsForward);
  EXPECT_GE(device_seconds, 0.029);
  EXPECT_LT(device_seconds, 1.0);
  EXPECT_LT(host_seconds, 0.02) << "queueing a host function took the host 20 ms or more";

  // A phase issued while the stream is captured is not timed, neither then nor at the replays.
  DeviceGraphs& graphs = kernels::cuda::cuda_graphs();
  graphs.begin_capture();
  {
    const ScopedPhase phase(Phase::kOptimizer);
    // EXPECT, not ASSERT: a return here would leave the stream capturing for the next tests.
    EXPECT_EQ(cudaLaunchHostFunc(kernels::cuda::stream(), sleep_30_ms, nullptr), cudaSuccess);
  }
  const std::unique_ptr<DeviceGraph> graph = graphs.end_capture();
  graph->replay();
  kernels::cuda::synchronize();
  EXPECT_EQ(total(Phase::kOptimizer), 0.0);

  // The events are reused after a collect: a second phase is timed alike.
  {
    const ScopedPhase phase(Phase::kExpertsBackward);
    ASSERT_EQ(cudaLaunchHostFunc(kernels::cuda::stream(), sleep_30_ms, nullptr), cudaSuccess);
  }
  EXPECT_GE(total(Phase::kExpertsBackward), 0.029);

  phase_timer::set_device_clock(nullptr);
  phase_timer::set_enabled(false);
  phase_timer::reset();
}

}  // namespace
}  // namespace moecore::cuda_phase_clock_test
