#include "model/swiglu_mlp.h"

#include "core/check.h"
#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

namespace {

// act (or its gradient) as the GEMMs read it: bf16 bits, which only bf16 GEMMs without MX caches
// take, or fp32 values.
LinearInput gemm_operand(kernels::MatmulPrecision precision, const LinearWeight& w,
                         ConstTensorView v) {
  if (v.dtype() != DType::kBf16) return {v.data<float>("swiglu_mlp")};
  MOE_CHECK(precision == kernels::MatmulPrecision::kBf16 && w.mx == nullptr,
            "[swiglu_mlp] a bf16 SwiGLU output needs bf16 GEMMs without MX caches");
  return LinearInput(v);
}

}  // namespace

void swiglu_mlp_forward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* x,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down, float* gu,
                        TensorView act, float* y) {
  if (s.rows == 0) return;
  linear_forward(precision, x, w_gate_up, gu, s.rows, s.dim, 2 * s.hidden);
  kernels::swiglu_forward(view(gu, {s.rows, 2 * s.hidden}), act);
  linear_forward(precision, gemm_operand(precision, w_down, act), w_down, y, s.rows, s.hidden,
                 s.dim);
}

void swiglu_mlp_backward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* dy,
                         const float* x, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                         const float* gu, ConstTensorView act, float* dx, float* dw_gate_up,
                         float* dw_down, float* scratch_dact, TensorView scratch_dgu,
                         bool accumulate_dx) {
  if (s.rows == 0) return;
  linear_backward(precision, dy, gemm_operand(precision, w_down, act), w_down, scratch_dact,
                  dw_down, s.rows, s.hidden, s.dim, false);
  kernels::swiglu_backward(view(scratch_dact, {s.rows, s.hidden}), view(gu, {s.rows, 2 * s.hidden}),
                           scratch_dgu);
  linear_backward(precision, gemm_operand(precision, w_gate_up, scratch_dgu), x, w_gate_up, dx,
                  dw_gate_up, s.rows, s.dim, 2 * s.hidden, accumulate_dx);
}

}  // namespace moecore
