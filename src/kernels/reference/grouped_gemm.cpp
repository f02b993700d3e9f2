// The grouped GEMM, the plain-loop oracle: per expert, per row, per output, a sum in double over
// operands rounded as the precision says (a bf16 operand read as the fp32 values of its bits).
#include "core/bf16.h"
#include "kernels/grouped_gemm_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/weight_values.h"

namespace moecore::kernels::reference {

namespace {

// A GEMM operand as the precision multiplies it.
double operand(MatmulPrecision precision, float v) {
  return double{precision == MatmulPrecision::kBf16 ? round_to_bf16(v) : v};
}

}  // namespace

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w, ConstTensorView expert_offsets,
                          TensorView y, MatmulPrecision precision) {
  expect_weight_dtype("grouped_gemm", "w", w, precision);
  expect_activation_dtype("grouped_gemm", "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims("grouped_gemm", x, w, expert_offsets);
  const std::span<const int64_t> offsets = host_expert_offsets("grouped_gemm", expert_offsets, s);
  const std::vector<float> x_values = weight_values("grouped_gemm", x);
  const float* xp = x_values.data();
  const std::vector<float> w_values = weight_values("grouped_gemm", w);
  const float* wp = w_values.data();
  float* yp = y.data<float>("grouped_gemm");
  for (int64_t e = 0; e < s.experts; ++e)
    for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e + 1)]; ++r)
      for (int64_t o = 0; o < s.out; ++o) {
        double sum = 0.0;
        for (int64_t i = 0; i < s.in; ++i)
          sum += operand(precision, xp[r * s.in + i]) *
                 operand(precision, wp[(e * s.out + o) * s.in + i]);
        yp[r * s.out + o] = static_cast<float>(sum);
      }
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  expect_weight_dtype("grouped_gemm_backward", "w", w, precision);
  expect_activation_dtype("grouped_gemm_backward", "dy", dy, precision);
  expect_activation_dtype("grouped_gemm_backward", "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims("grouped_gemm_backward", x, w, expert_offsets);
  const std::span<const int64_t> offsets =
      host_expert_offsets("grouped_gemm_backward", expert_offsets, s);
  const std::vector<float> dy_values = weight_values("grouped_gemm_backward", dy);
  const std::vector<float> x_values = weight_values("grouped_gemm_backward", x);
  const float* dyp = dy_values.data();
  const float* xp = x_values.data();
  const std::vector<float> w_values = weight_values("grouped_gemm_backward", w);
  const float* wp = w_values.data();
  float* dxp = dx.raw() != nullptr ? dx.data<float>("grouped_gemm_backward") : nullptr;
  float* dwp = dw.data<float>("grouped_gemm_backward");
  for (int64_t e = 0; e < s.experts; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t end = offsets[static_cast<size_t>(e + 1)];
    for (int64_t r = begin; r < end && dxp != nullptr; ++r)
      for (int64_t i = 0; i < s.in; ++i) {
        double sum = 0.0;
        for (int64_t o = 0; o < s.out; ++o)
          sum += operand(precision, dyp[r * s.out + o]) *
                 operand(precision, wp[(e * s.out + o) * s.in + i]);
        dxp[r * s.in + i] = static_cast<float>(sum);
      }
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t i = 0; i < s.in; ++i) {
        double sum = double{dwp[(e * s.out + o) * s.in + i]};
        for (int64_t r = begin; r < end; ++r)
          sum += operand(precision, dyp[r * s.out + o]) * operand(precision, xp[r * s.in + i]);
        dwp[(e * s.out + o) * s.in + i] = static_cast<float>(sum);
      }
  }
}

}  // namespace moecore::kernels::reference
