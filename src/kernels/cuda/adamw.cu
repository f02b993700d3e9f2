// AdamW: one element per thread in a grid-stride loop, the CPU's fp32 operations in its order.
// The _rn intrinsics keep nvcc from contracting a product and a sum into an fma (the host build
// does not contract), so both backends round every step alike.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamWScalars c, const float* step_coefficients,
                             const float* step_factors) {
  if (step_coefficients != nullptr) {  // the step's schedule, written by the host before it
    c.decay_factor = step_coefficients[0];
    c.step_size = step_coefficients[1];
    c.bias2_sqrt = step_coefficients[2];
  }
  if (step_factors != nullptr) {
    if (step_factors[1] == 0.0f) return;  // a skipped step (step_decision)
    c.grad_scale = step_factors[0];
  }
  const float one_minus_b1 = 1.0f - c.b1, one_minus_b2 = 1.0f - c.b2;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float gi = __fmul_rn(g[i], c.grad_scale);
    const float pi = __fmul_rn(p[i], c.decay_factor);
    const float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(one_minus_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(one_minus_b2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias2_sqrt), c.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = __fsub_rn(pi, __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
  }
}

}  // namespace

void launch_adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                         int64_t n, const AdamWScalars& scalars, const float* step_coefficients,
                         const float* step_factors, cudaStream_t stream) {
  if (n > 0)
    adamw_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(
        params, grads, exp_avg, exp_avg_sq, n, scalars, step_coefficients, step_factors);
}

}  // namespace moecore::kernels::cuda
