// RoPE: one (vector, pair) per thread in a grid-stride loop; each pair is rotated on its own, so
// in place is safe and there is no order to fix. The CPU backend's expressions
// (kernels/cpu/rope.cpp, HF's x * cos + rotate_half(x) * sin).
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

// The backward rotates by the opposite angle: the transpose of a rotation. One template for both
// so that they cannot drift apart.
template <bool kInverse>
__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t seq,
                            int64_t heads, int64_t half, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t vector = i / half, k = i - vector * half;
    const int64_t t = (vector / heads) % seq;
    float* lo = x + vector * 2 * half + k;
    float* hi = lo + half;
    const float c = cos[t * half + k];
    const float s = kInverse ? -sin[t * half + k] : sin[t * half + k];
    const float x_lo = *lo, x_hi = *hi;
    *lo = x_lo * c + (-x_hi) * s;
    *hi = x_hi * c + x_lo * s;
  }
}

}  // namespace

void launch_rope(float* x, const float* cos, const float* sin, int64_t batch, int64_t seq,
                 int64_t heads, int64_t half, bool inverse, cudaStream_t stream) {
  const int64_t n = batch * seq * heads * half;
  if (n == 0) return;
  if (inverse) {
    rope_kernel<true>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(x, cos, sin, seq, heads, half, n);
  } else {
    rope_kernel<false>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(x, cos, sin, seq, heads, half, n);
  }
}

}  // namespace moecore::kernels::cuda
