// The optimizer step's decision on the CPU: the shared serial walk (kernels/step_decision_rules.h),
// the CUDA kernel's too.
#include "kernels/cpu/ops.h"
#include "kernels/step_decision_checks.h"
#include "kernels/step_decision_rules.h"

namespace moecore::kernels::cpu {

void step_decision(ConstTensorView loss_rows, ConstTensorView squares, const StepDecisionOptions& o,
                   ConstTensorView limits, TensorView decision, TensorView step_factors) {
  constexpr const char* kOp = "step_decision";
  const int64_t rows = step_decision_rows(kOp, loss_rows, squares, decision, step_factors);
  expect_step_limits(kOp, limits);
  step_decision_in_order(
      loss_rows.data<double>(kOp), rows, squares.data<double>(kOp),
      {o.max_grad_norm, o.loss_limit, o.norm_limit, o.lb_coef, o.z_coef, o.lm_z_coef, o.loss_scale},
      view_given(limits) ? limits.data<double>(kOp) : nullptr, decision.data<double>(kOp),
      step_factors.data<float>(kOp));
}

}  // namespace moecore::kernels::cpu
