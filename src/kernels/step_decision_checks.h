// The argument checks of step_decision and of the step factors that adamw_update and
// router_bias_update may read, shared by every backend.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

// Given step factors are f32 [2].
inline void expect_step_factors(const char* op, ConstTensorView step_factors,
                                Device device = Device::kCpu) {
  if (!view_given(step_factors)) return;
  expect_shape(op, "step_factors", step_factors, {2}, device);
  MOE_CHECK(step_factors.dtype() == DType::kF32, "[{}] step_factors must be f32, got {}", op,
            dtype_name(step_factors.dtype()));
}

// Given step coefficients (adamw_update's) are f32 [kAdamWStepCoefficients].
inline void expect_step_coefficients(const char* op, ConstTensorView step_coefficients,
                                     Device device = Device::kCpu) {
  if (!view_given(step_coefficients)) return;
  expect_shape(op, "step_coefficients", step_coefficients, {kAdamWStepCoefficients}, device);
  MOE_CHECK(step_coefficients.dtype() == DType::kF32, "[{}] step_coefficients must be f32, got {}",
            op, dtype_name(step_coefficients.dtype()));
}

// Given limits are f64 [2].
inline void expect_step_limits(const char* op, ConstTensorView limits,
                               Device device = Device::kCpu) {
  if (!view_given(limits)) return;
  expect_shape(op, "limits", limits, {2}, device);
  MOE_CHECK(limits.dtype() == DType::kF64, "[{}] limits must be f64, got {}", op,
            dtype_name(limits.dtype()));
}

// loss_rows [m, kLossParts] f64, squares [2] f64, decision [3] f64, step_factors [2] f32; returns
// m.
inline int64_t step_decision_rows(const char* op, ConstTensorView loss_rows,
                                  ConstTensorView squares, ConstTensorView decision,
                                  ConstTensorView step_factors, Device device = Device::kCpu) {
  MOE_CHECK(loss_rows.rank() == 2, "[{}] loss_rows must be [m, {}], got rank {}", op, kLossParts,
            loss_rows.rank());
  const int64_t rows = loss_rows.size(0);
  expect_shape(op, "loss_rows", loss_rows, {rows, kLossParts}, device);
  expect_shape(op, "squares", squares, {2}, device);
  expect_shape(op, "decision", decision, {3}, device);
  expect_shape(op, "step_factors", step_factors, {2}, device);
  for (const ConstTensorView& v : {loss_rows, squares, decision})
    MOE_CHECK(v.dtype() == DType::kF64, "[{}] losses, squares and the decision are f64, got {}", op,
              dtype_name(v.dtype()));
  MOE_CHECK(step_factors.dtype() == DType::kF32, "[{}] step_factors must be f32, got {}", op,
            dtype_name(step_factors.dtype()));
  return rows;
}

}  // namespace moecore::kernels
