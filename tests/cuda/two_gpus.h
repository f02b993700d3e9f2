// The NCCL tests that run two ranks in one process, one GPU each (ncclCommInitAll): why they
// cannot run here, for their GTEST_SKIP, or "" on a machine with two GPUs or more.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/runtime.h"

namespace moecore::cuda_test {

inline std::string fewer_than_two_gpus() {
  int devices = 0;
  MOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices >= 2) return "";
  return "needs 2 GPUs (NCCL refuses two ranks on one device); " + std::to_string(devices) +
         " visible";
}

}  // namespace moecore::cuda_test
