// The optimizer step's decision on the GPU (step_decision.cu): the decision and the factors the
// update reads stay on the device.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/step_decision_checks.h"
#include "kernels/step_decision_rules.h"

namespace moecore::kernels::cuda {

void step_decision(ConstTensorView loss_rows, ConstTensorView squares, const StepDecisionOptions& o,
                   ConstTensorView limits, TensorView decision, TensorView step_factors) {
  constexpr const char* kOp = "step_decision";
  expect_on_device(kOp, "limits", limits);
  expect_step_limits(kOp, limits, Device::kCuda);
  expect_on_device(kOp, "loss_rows", loss_rows);
  expect_on_device(kOp, "squares", squares);
  expect_on_device(kOp, "decision", decision);
  expect_on_device(kOp, "step_factors", step_factors);
  const int64_t rows =
      step_decision_rows(kOp, loss_rows, squares, decision, step_factors, Device::kCuda);
  launch_step_decision(
      rows > 0 ? loss_rows.data<double>(kOp) : nullptr, rows, squares.data<double>(kOp),
      {o.max_grad_norm, o.loss_limit, o.norm_limit, o.lb_coef, o.z_coef, o.lm_z_coef, o.loss_scale},
      view_given(limits) ? limits.data<double>(kOp) : nullptr, decision.data<double>(kOp),
      step_factors.data<float>(kOp), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_step_decision");
}

}  // namespace moecore::kernels::cuda
