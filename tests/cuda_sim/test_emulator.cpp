// cudasim's own checks, shown to fire: each rule the emulation enforces is broken by a kernel of
// emulator_checks.cu and reported as the device would (or, where the device's behaviour is
// undefined, as a launch failure naming the kernel and the rule); a kernel that keeps the rules
// gives its result; captures refuse what CUDA's refuse and replay what they recorded.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emulator_checks.h"
#include "sim_state.h"

namespace cudasim_checks {
namespace {

// A stream of its own, and the emulator's errors forgotten after each test.
class Cudasim : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess); }
  void TearDown() override {
    cudaStreamDestroy(stream_);
    cudasim::clear_errors();
  }
  template <typename T>
  T* device_array(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }
  ~Cudasim() override {
    for (void* p : allocations_) cudaFree(p);
  }

  // The launch's status at the next synchronisation and what the emulator printed.
  std::string failure_of(void (*launch)(cudaStream_t, void*), void* out, cudaError_t* status) {
    ::testing::internal::CaptureStderr();
    launch(stream_, out);
    *status = cudaStreamSynchronize(stream_);
    return ::testing::internal::GetCapturedStderr();
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(Cudasim, ABarrierReachedAtTwoPlacesFailsTheLaunch) {
  cudaError_t status = cudaSuccess;
  const std::string printed = failure_of(
      [](cudaStream_t s, void* out) { launch_divergent_barrier(static_cast<int*>(out), s); },
      device_array<int>(64), &status);
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("divergent_barrier_kernel (block 0,0,0 of 1,1,1): threads wait at "
                         "different __syncthreads calls"),
            std::string::npos)
      << printed;
}

TEST_F(Cudasim, ABarrierSomeThreadsReturnedBeforeFailsTheLaunch) {
  cudaError_t status = cudaSuccess;
  const std::string printed =
      failure_of([](cudaStream_t s, void* out) { launch_early_return(static_cast<int*>(out), s); },
                 device_array<int>(64), &status);
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("early_return_kernel"), std::string::npos) << printed;
  EXPECT_NE(printed.find("not every thread reached the barrier"), std::string::npos) << printed;
}

TEST_F(Cudasim, AShuffleSomeLanesNeverReachFailsTheLaunch) {
  cudaError_t status = cudaSuccess;
  const std::string printed = failure_of(
      [](cudaStream_t s, void* out) { launch_partial_shuffle(static_cast<float*>(out), s); },
      device_array<float>(32), &status);
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("partial_shuffle_kernel"), std::string::npos) << printed;
  EXPECT_NE(printed.find("a warp collective some lanes never reach"), std::string::npos) << printed;
}

TEST_F(Cudasim, AKernelThatKeepsTheRulesGivesItsResult) {
  const int blocks = 3, threads = 128;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  float* in_d = device_array<float>(in.size());
  float* out_d = device_array<float>(blocks);
  ASSERT_EQ(cudaMemcpy(in_d, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  launch_block_sum(in_d, out_d, blocks, threads, stream_);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> out(blocks);
  ASSERT_EQ(cudaMemcpy(out.data(), out_d, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int b = 0; b < blocks; ++b) {
    float expected = 0.0f;
    for (int t = 0; t < threads; ++t) expected += in[static_cast<size_t>(b * threads + t)];
    EXPECT_EQ(out[static_cast<size_t>(b)], expected) << "block " << b;
  }
}

TEST_F(Cudasim, ALaunchShapeBeyondTheDeviceIsRefusedAndNotSticky) {
  int* out = device_array<int>(1);
  ASSERT_EQ(cudaMemsetAsync(out, 0, sizeof(int), stream_), cudaSuccess);
  ::testing::internal::CaptureStderr();
  launch_write_one(out, 1025, stream_);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, as CUDA's launch errors are
  int host = -1;
  ASSERT_EQ(cudaMemcpy(&host, out, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 0);  // nothing ran
}

TEST_F(Cudasim, DynamicSharedMemoryBeyond48KiBNeedsTheKernelsOptIn) {
  float* out = device_array<float>(1);
  const int floats = 16384;  // 64 KiB
  ::testing::internal::CaptureStderr();
  launch_dynamic_shared(out, floats, /*opt_in=*/false, stream_);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  launch_dynamic_shared(out, floats, /*opt_in=*/true, stream_);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  float host = 0.0f;
  ASSERT_EQ(cudaMemcpy(&host, out, sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 2.0f);
}

TEST_F(Cudasim, AHostPointerGivenToAKernelIsAnIllegalAddress) {
  int host = 0;
  cudaError_t status = cudaSuccess;
  const std::string printed =
      failure_of([](cudaStream_t s, void* out) { launch_write_one(static_cast<int*>(out), 1, s); },
                 &host, &status);
  EXPECT_EQ(status, cudaErrorIllegalAddress);
  EXPECT_EQ(host, 0);
  EXPECT_NE(printed.find("write_one_kernel: pointer argument 1 points to host memory"),
            std::string::npos)
      << printed;
}

// A kernel's fault reaches the host as on the device, where the kernel runs after its launch
// returned: the launch's own check sees nothing, the next wait reports it, and from then on every
// check does (sticky).
TEST_F(Cudasim, AKernelsFaultReachesTheHostAtTheNextWaitNotAtItsLaunch) {
  int host = 0;
  ::testing::internal::CaptureStderr();
  launch_write_one(&host, 1, stream_);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorIllegalAddress);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
}

TEST_F(Cudasim, FreshDeviceMemoryReadsAsNaN) {
  float* fresh = device_array<float>(4);
  std::vector<float> host(4, 0.0f);
  ASSERT_EQ(cudaMemcpy(host.data(), fresh, 4 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (const float v : host) EXPECT_TRUE(std::isnan(v));
}

TEST_F(Cudasim, ACaptureRefusesAWaitAndIsThenInvalid) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorStreamCaptureUnsupported);
  ::testing::internal::GetCapturedStderr();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &capture), cudaSuccess);
  EXPECT_EQ(capture, cudaStreamCaptureStatusInvalidated);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
}

// Captured work does not run until the graph is launched, and each launch runs it on what the
// device memory holds then.
TEST_F(Cudasim, AGraphRunsItsWorkAtEachLaunchNotAtTheCapture) {
  const int threads = 64;
  float* in = device_array<float>(threads);
  float* out = device_array<float>(1);
  ASSERT_EQ(cudaMemsetAsync(out, 0, sizeof(float), stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch_block_sum(in, out, 1, threads, stream_);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  float sum = -1.0f;
  ASSERT_EQ(cudaMemcpy(&sum, out, sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(sum, 0.0f);  // the capture ran nothing
  for (const float value : {1.0f, 2.5f}) {
    const std::vector<float> values(threads, value);
    ASSERT_EQ(cudaMemcpy(in, values.data(), threads * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&sum, out, sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(sum, value * threads);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(Cudasim, SharedMemoryNoThreadWroteReadsAsNaN) {
  float* out = device_array<float>(64);
  launch_unwritten_shared(out, stream_);
  std::vector<float> host(64);
  ASSERT_EQ(cudaMemcpy(host.data(), out, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t t = 0; t < 64; ++t) {
    if (t < 32) {
      EXPECT_EQ(host[t], 1.0f) << t;
    } else {
      EXPECT_TRUE(std::isnan(host[t])) << t;
    }
  }
}

TEST_F(Cudasim, StaticAndDynamicSharedMemoryTogetherMustFitTheBlock) {
  float* out = device_array<float>(32);
  launch_large_static_shared(out, 4 * 1024, stream_);  // 44 KiB: fits the 48
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaError_t status = cudaSuccess;
  const std::string printed =
      failure_of([](cudaStream_t s,
                    void* o) { launch_large_static_shared(static_cast<float*>(o), 12 * 1024, s); },
                 out, &status);  // 52 KiB
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("__shared__ big: 40960 bytes of static and 12288 of dynamic shared "
                         "memory exceed the block's 49152 bytes"),
            std::string::npos)
      << printed;
}

TEST_F(Cudasim, LanesAtDifferentWarpCollectivesFailTheLaunch) {
  cudaError_t status = cudaSuccess;
  const std::string printed = failure_of(
      [](cudaStream_t s, void* out) { launch_mixed_collectives(static_cast<float*>(out), s); },
      device_array<float>(32), &status);
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("different warp collectives"), std::string::npos) << printed;
}

TEST_F(Cudasim, ACopyPastItsAllocationIsRefused) {
  float* four = device_array<float>(4);
  const std::vector<float> five(5, 1.0f);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cudaMemcpyAsync(four, five.data(), 5 * sizeof(float), cudaMemcpyHostToDevice, stream_),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(four, 0, 5 * sizeof(float), stream_), cudaErrorInvalidValue);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaMemcpyAsync(four, five.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, stream_),
            cudaSuccess);
}

// Memory a capture allocates and frees is the graph's between those two points of each launch:
// a kernel recorded after the free gets an illegal address when the graph runs.
TEST_F(Cudasim, AGraphsMemoryIsGoneAfterItsFreeInTheGraph) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMallocAsync(&scratch, sizeof(int), stream_), cudaSuccess);
  launch_write_one(static_cast<int*>(scratch), 1, stream_);  // inside its life: fine
  ASSERT_EQ(cudaFreeAsync(scratch, stream_), cudaSuccess);
  launch_write_one(static_cast<int*>(scratch), 1, stream_);  // after its free
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorIllegalAddress);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("write_one_kernel: pointer argument 1 points to a graph's memory outside "
                         "its allocation in the graph"),
            std::string::npos)
      << printed;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace cudasim_checks
