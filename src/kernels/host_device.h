// For the few headers whose arithmetic both the CPU backend and a CUDA kernel run (nvcc compiles
// them): functions marked for both, and the double operations in round-to-nearest without
// contraction, so that both give the same bits (nvcc would fuse a product into a following sum;
// the host build, with -ffp-contract=off, never does).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MOECORE_HOST_DEVICE __host__ __device__
#else
#define MOECORE_HOST_DEVICE
#endif

namespace moecore::kernels {

MOECORE_HOST_DEVICE inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

MOECORE_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

MOECORE_HOST_DEVICE inline double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// False for NaN and +-Inf (x - x is NaN for both), without a library call.
MOECORE_HOST_DEVICE inline bool finite(double x) {
  return x - x == 0.0;
}

}  // namespace moecore::kernels
