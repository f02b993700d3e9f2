// AdamW on the CPU: chunks of kAdamWChunk elements over the OpenMP pool (one thread below a few
// chunks, where forking costs more than it saves), each chunk SIMD-cloned.
#include <algorithm>
#include <cmath>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/step_decision_checks.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

// The coefficients an update uses: `given`, with the step's from step_coefficients (host memory)
// when it has them.
AdamWCoefficients with_step_coefficients(AdamWCoefficients given,
                                         ConstTensorView step_coefficients) {
  if (!view_given(step_coefficients)) return given;
  const float* c = step_coefficients.data<float>("adamw");
  given.decay_factor = c[0];
  given.step_size = c[1];
  given.bias2_sqrt = c[2];
  return given;
}

constexpr int64_t kAdamWChunk = 16384;

MOECORE_SIMD_CLONES void adamw_chunk(const AdamWCoefficients& c, float* p, const float* g, float* m,
                                     float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    p[i] *= c.decay_factor;
    m[i] = c.b1 * m[i] + (1.0f - c.b1) * gi;
    v[i] = c.b2 * v[i] + (1.0f - c.b2) * gi * gi;
    const float denom = std::sqrt(v[i]) / c.bias2_sqrt + c.eps;
    p[i] -= c.step_size * m[i] / denom;
  }
}

}  // namespace

void adamw_update(TensorView params, ConstTensorView grads, TensorView exp_avg,
                  TensorView exp_avg_sq, const AdamWCoefficients& given,
                  ConstTensorView step_coefficients, ConstTensorView step_factors) {
  constexpr const char* kOp = "adamw";
  expect_step_coefficients(kOp, step_coefficients);
  expect_step_factors(kOp, step_factors);
  AdamWCoefficients coefficients = with_step_coefficients(given, step_coefficients);
  if (view_given(step_factors)) {
    const float* factors = step_factors.data<float>(kOp);
    if (factors[1] == 0.0f) return;  // a skipped step
    coefficients.grad_scale = factors[0];
  }
  const int64_t count = params.numel();
  expect_shape(kOp, "params", params, {count});
  expect_shape(kOp, "grads", grads, {count});
  expect_shape(kOp, "exp_avg", exp_avg, {count});
  expect_shape(kOp, "exp_avg_sq", exp_avg_sq, {count});
  float* p = params.data<float>(kOp);
  const float* g = grads.data<float>(kOp);
  float* m = exp_avg.data<float>(kOp);
  float* v = exp_avg_sq.data<float>(kOp);
  const int64_t chunks = (count + kAdamWChunk - 1) / kAdamWChunk;
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i = c * kAdamWChunk, n = std::min(kAdamWChunk, count - i);
    adamw_chunk(coefficients, p + i, g + i, m + i, v + i, n);
  }
}

}  // namespace moecore::kernels::cpu
