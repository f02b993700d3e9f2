// AdamW on the GPU (adamw.cu), checked as the CPU backend checks it.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/step_decision_checks.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void adamw_update(TensorView params, ConstTensorView grads, TensorView exp_avg,
                  TensorView exp_avg_sq, const AdamWCoefficients& coefficients,
                  ConstTensorView step_coefficients, ConstTensorView step_factors) {
  constexpr const char* kOp = "adamw";
  expect_on_device(kOp, "step_coefficients", step_coefficients);
  expect_step_coefficients(kOp, step_coefficients, Device::kCuda);
  expect_on_device(kOp, "step_factors", step_factors);
  expect_step_factors(kOp, step_factors, Device::kCuda);
  const int64_t count = params.numel();
  expect_on_device(kOp, "params", params);
  expect_on_device(kOp, "grads", grads);
  expect_on_device(kOp, "exp_avg", exp_avg);
  expect_on_device(kOp, "exp_avg_sq", exp_avg_sq);
  expect_shape(kOp, "params", params, {count}, Device::kCuda);
  expect_shape(kOp, "grads", grads, {count}, Device::kCuda);
  expect_shape(kOp, "exp_avg", exp_avg, {count}, Device::kCuda);
  expect_shape(kOp, "exp_avg_sq", exp_avg_sq, {count}, Device::kCuda);
  const AdamWCoefficients& c = coefficients;
  const AdamWScalars scalars{c.decay_factor, c.b1,        c.b2,        c.bias2_sqrt,
                             c.eps,          c.step_size, c.grad_scale};
  launch_adamw_update(params.data<float>(kOp), grads.data<float>(kOp), exp_avg.data<float>(kOp),
                      exp_avg_sq.data<float>(kOp), count, scalars,
                      view_given(step_coefficients) ? step_coefficients.data<float>(kOp) : nullptr,
                      view_given(step_factors) ? step_factors.data<float>(kOp) : nullptr, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_adamw_update");
}

}  // namespace moecore::kernels::cuda
