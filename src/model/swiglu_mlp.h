// SwiGLU feed-forward: y = down(silu(gate(x)) * up(x)), with gate and up stored as one [2H, d]
// matrix (gate rows first) so both come from a single GEMM. Used by dense MLP layers and the
// shared expert (the routed experts run theirs as grouped GEMMs, model/grouped_experts.h).
//
// The SwiGLU output `act`, which the backward reads again, and its gradient are read by nothing
// but the MLP's GEMMs: they are kept and written in kept_mlp_act_dtype (model/precision_recipe.h),
// bf16 bits where those GEMMs multiply bf16 without MX caches (the same rounding the GEMMs made of
// fp32 values: the same products), else fp32.
#pragma once

#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/matmul_precision.h"
#include "model/linear.h"

namespace moecore {

struct SwigluShape {
  int64_t rows;    // tokens
  int64_t dim;     // model width d
  int64_t hidden;  // intermediate width H
};

// Both GEMMs in `precision`. x: [rows, d]; w_gate_up: [2H, d]; w_down: [d, H] (fp32, or bf16
// copies in a bf16 GEMM, with MX caches in MXFP8: model/linear.h); saves gu: [rows, 2H] (fp32)
// and act: [rows, H] (fp32, or bf16 in a bf16 GEMM without MX caches); y: [rows, d] (=).
void swiglu_mlp_forward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* x,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down, float* gu,
                        TensorView act, float* y);

// dy: [rows, d]. dx: [rows, d] (= or += when accumulate_dx); dw_gate_up, dw_down (+=).
// scratch_dact: [rows, H] (fp32) and scratch_dgu: [rows, 2H] (act's dtype) are caller-owned work
// space.
void swiglu_mlp_backward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* dy,
                         const float* x, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                         const float* gu, ConstTensorView act, float* dx, float* dw_gate_up,
                         float* dw_down, float* scratch_dact, TensorView scratch_dgu,
                         bool accumulate_dx);

}  // namespace moecore
