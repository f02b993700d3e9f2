// Elementwise kernels: one element per thread in a grid-stride loop (each result is one rounding).
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(const float* x, float factor, float* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    out[i] = x[i] * factor;
  }
}

__global__ void to_bf16_kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) dst[i] = float_to_bf16_bits(src[i]);
}

}  // namespace

void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n > 0) add_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(a, b, out, n);
}

void launch_scale(const float* x, float factor, float* out, int64_t n, cudaStream_t stream) {
  if (n > 0) scale_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(x, factor, out, n);
}

void launch_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n > 0) to_bf16_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(src, dst, n);
}

}  // namespace moecore::kernels::cuda
