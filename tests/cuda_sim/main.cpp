// The CUDA tests' entry point on the emulated GPU (cmake/cuda_sim.cmake): the device is always
// there, so nothing is skipped; it names the device and runs every test. The finite-difference
// gradient checks of the per-op harness check 8 elements of each tensor, spread over it, instead
// of every one: each element takes two forward launches, and a launch here runs every CUDA thread
// as a fiber, a few hundred thousand switches for a reduction kernel (all of them made the suite
// take hours). The gradients themselves are still compared in full with the reference backend's.
#include <gtest/gtest.h>

#include <cstdio>

#include "dist/mpi/mpi_runtime.h"
#include "gradcheck.h"
#include "kernels/cuda/runtime.h"

// Under mpirun every process is a rank with an emulated GPU of its own, and cudasim's NCCL joins
// them (nccl_sim.cpp): the tests named *ranks2* run there (ctest CudaSim.TwoRanks).
int main(int argc, char** argv) {
  moecore::dist::init_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  moecore::gradcheck::max_checked_elements() = 8;
  const auto device = moecore::kernels::cuda::current_device_info();
  std::printf("moecore_cuda_sim_tests on %s\n", moecore::kernels::cuda::describe(device).c_str());
  moecore::kernels::cuda::keep_freed_device_memory();
  return RUN_ALL_TESTS();
}
