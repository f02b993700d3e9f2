// RoPE on the CPU: (batch, position) pairs over the OpenMP pool; the heads of one position share
// a cos/sin row, so they stay inside one iteration.
#include "kernels/cpu/ops.h"
#include "kernels/rope_checks.h"

namespace moecore::kernels::cpu {

namespace {

// Applies, to every head vector of x, the per-pair rotation by +angle (kSign = +1, forward) or by
// -angle (kSign = -1, backward: the transpose of a rotation is the rotation by the opposite
// angle). One template instead of two copies so forward and backward cannot drift apart.
template <int kSign>
void rotate(const char* op, TensorView x, ConstTensorView cos, ConstTensorView sin,
            int64_t first_position) {
  const RopeDims dims = rope_dims(op, x, cos, sin, first_position);
  const int64_t batch = dims.batch, seq = dims.seq, n_heads = dims.heads, half = dims.half;
  float* xp = x.data<float>(op);
  const float* cos_table = cos.data<float>(op) + first_position * half;
  const float* sin_table = sin.data<float>(op) + first_position * half;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* cos_t = cos_table + t * half;
      const float* sin_t = sin_table + t * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* lo = xp + ((b * seq + t) * n_heads + h) * 2 * half;
        float* hi = lo + half;
        // Same expression order as HF (x * cos + rotate_half(x) * sin) to stay bit-close to it.
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos_t[i];
          const float s = kSign > 0 ? sin_t[i] : -sin_t[i];
          const float x_lo = lo[i];
          const float x_hi = hi[i];
          lo[i] = x_lo * c + (-x_hi) * s;
          hi[i] = x_hi * c + x_lo * s;
        }
      }
    }
  }
}

}  // namespace

void rope_forward(TensorView x, ConstTensorView cos, ConstTensorView sin, int64_t first_position) {
  rotate<+1>("rope", x, cos, sin, first_position);
}

void rope_backward(TensorView dx, ConstTensorView cos, ConstTensorView sin,
                   int64_t first_position) {
  rotate<-1>("rope_backward", dx, cos, sin, first_position);
}

}  // namespace moecore::kernels::cpu
