// AdamW, the plain-loop oracle: torch.optim.AdamW's formula element by element, in double.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/step_decision_checks.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void adamw_update(TensorView params, ConstTensorView grads, TensorView exp_avg,
                  TensorView exp_avg_sq, const AdamWCoefficients& coefficients,
                  ConstTensorView step_coefficients, ConstTensorView step_factors) {
  const int64_t count = params.numel();
  expect_shape("adamw", "grads", grads, {count});
  expect_step_coefficients("adamw", step_coefficients);
  expect_step_factors("adamw", step_factors);
  AdamWCoefficients c = coefficients;
  if (view_given(step_coefficients)) {
    const float* given = step_coefficients.data<float>("adamw");
    c.decay_factor = given[0];
    c.step_size = given[1];
    c.bias2_sqrt = given[2];
  }
  if (view_given(step_factors)) {
    const float* factors = step_factors.data<float>("adamw");
    if (factors[1] == 0.0f) return;  // a skipped step
    c.grad_scale = factors[0];
  }
  float* p = params.data<float>("adamw");
  const float* g = grads.data<float>("adamw");
  float* m = exp_avg.data<float>("adamw");
  float* v = exp_avg_sq.data<float>("adamw");
  for (int64_t i = 0; i < count; ++i) {
    const double gi = double{g[i]} * double{c.grad_scale};
    const double mi = double{c.b1} * double{m[i]} + (1.0 - double{c.b1}) * gi;
    const double vi = double{c.b2} * double{v[i]} + (1.0 - double{c.b2}) * gi * gi;
    const double decayed = double{p[i]} * double{c.decay_factor};
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p[i] = static_cast<float>(decayed - double{c.step_size} * mi /
                                            (std::sqrt(vi) / double{c.bias2_sqrt} + double{c.eps}));
  }
}

}  // namespace moecore::kernels::reference
