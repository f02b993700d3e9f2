// SwiGLU feed-forward: y = down(silu(gate(x)) * up(x)), with gate and up stored as one [2H, d]
// matrix (gate rows first) so both come from a single GEMM. Used by dense MLP layers, the shared
// expert, and each expert's slice of the grouped GEMM.
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
// copies in a bf16 GEMM, with MX caches in MXFP8: model/linear.h); saves gu: [rows, 2H], act:
// [rows, H]; y: [rows, d] (=).
void swiglu_mlp_forward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* x,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down, float* gu,
                        float* act, float* y);

// dy: [rows, d]. dx: [rows, d] (= or += when accumulate_dx); dw_gate_up, dw_down (+=).
// scratch_dact: [rows, H] and scratch_dgu: [rows, 2H] are caller-owned work space.
void swiglu_mlp_backward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* dy,
                         const float* x, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                         const float* gu, const float* act, float* dx, float* dw_gate_up,
                         float* dw_down, float* scratch_dact, float* scratch_dgu,
                         bool accumulate_dx);

}  // namespace moecore
