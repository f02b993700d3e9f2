#include "model/swiglu_mlp.h"

#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

void swiglu_mlp_forward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* x,
                        const LinearWeight& w_gate_up, const LinearWeight& w_down, float* gu,
                        float* act, float* y) {
  if (s.rows == 0) return;
  linear_forward(precision, x, w_gate_up, gu, s.rows, s.dim, 2 * s.hidden);
  kernels::swiglu_forward(view(gu, {s.rows, 2 * s.hidden}), view(act, {s.rows, s.hidden}));
  linear_forward(precision, act, w_down, y, s.rows, s.hidden, s.dim);
}

void swiglu_mlp_backward(kernels::MatmulPrecision precision, const SwigluShape& s, const float* dy,
                         const float* x, const LinearWeight& w_gate_up, const LinearWeight& w_down,
                         const float* gu, const float* act, float* dx, float* dw_gate_up,
                         float* dw_down, float* scratch_dact, float* scratch_dgu,
                         bool accumulate_dx) {
  if (s.rows == 0) return;
  linear_backward(precision, dy, act, w_down, scratch_dact, dw_down, s.rows, s.hidden, s.dim,
                  false);
  kernels::swiglu_backward(view(scratch_dact, {s.rows, s.hidden}), view(gu, {s.rows, 2 * s.hidden}),
                           view(scratch_dgu, {s.rows, 2 * s.hidden}));
  linear_backward(precision, scratch_dgu, x, w_gate_up, dx, dw_gate_up, s.rows, s.dim, 2 * s.hidden,
                  accumulate_dx);
}

}  // namespace moecore
