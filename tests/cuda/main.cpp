// The CUDA tests' entry point. Without a usable GPU (no driver, a driver older than the runtime,
// no device) it prints one line saying why and exits 77, which ctest reports as skipped
// (SKIP_RETURN_CODE); with one, it names the device (and the NCCL library loaded, where NCCL's
// tests are built) and runs every test. Under mpirun each process
// is a rank on its node's GPU of its local rank (kernels/cuda/device_selection.h): the *ranks2*
// tests run there (ctest Cuda.TwoRanks), and skip in one line where the two share a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dist/mpi/mpi_runtime.h"
#include "kernels/cuda/runtime.h"
#if MOECORE_CUDA_TESTS_HAVE_NCCL
#include "dist/nccl/nccl_registration.h"
#endif

int main(int argc, char** argv) {
  moecore::dist::init_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const std::string why = moecore::kernels::cuda::unavailable_reason();
  if (!why.empty() && !GTEST_FLAG_GET(list_tests)) {
    std::printf("moecore_cuda_tests: skipped, no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();
  const auto device = moecore::kernels::cuda::current_device_info();
  std::printf("moecore_cuda_tests on %s\n", moecore::kernels::cuda::describe(device).c_str());
#if MOECORE_CUDA_TESTS_HAVE_NCCL
  // The library the loader found, which scripts/gpu_check.sh shows beside the headers' version:
  // a mismatch skips the symmetric exchange's tests, one line each among hundreds.
  std::printf("moecore_cuda_tests: %s\n", moecore::dist::nccl::describe_library().c_str());
#endif
  // The harness stages hundreds of thousands of calls through stream-ordered allocations.
  moecore::kernels::cuda::keep_freed_device_memory();
  return RUN_ALL_TESTS();
}
