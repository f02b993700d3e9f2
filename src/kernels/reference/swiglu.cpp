// SwiGLU, the plain-loop oracle, in double with std::exp; a bf16 output holds the fp32 result
// rounded by float_to_bf16.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/reference/weight_values.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void swiglu_forward(ConstTensorView gu, TensorView act) {
  const int64_t rows = act.size(0), hidden = act.size(1);
  expect_shape("swiglu", "gu", gu, {rows, 2 * hidden});
  expect_f32_or_bf16("swiglu", "act", act);
  const float* gup = gu.data<float>("swiglu");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < hidden; ++j) {
      const double g = double{gup[r * 2 * hidden + j]},
                   u = double{gup[r * 2 * hidden + hidden + j]};
      store_output("swiglu", act, r * hidden + j, static_cast<float>(g / (1.0 + std::exp(-g)) * u));
    }
}

// d/dg [silu(g) u] = u sig (1 + g (1 - sig)); d/du = silu(g).
void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  const int64_t rows = dact.size(0), hidden = dact.size(1);
  expect_shape("swiglu_backward", "dgu", dgu, {rows, 2 * hidden});
  expect_f32_or_bf16("swiglu_backward", "dgu", dgu);
  const float* dap = dact.data<float>("swiglu_backward");
  const float* gup = gu.data<float>("swiglu_backward");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < hidden; ++j) {
      const double g = double{gup[r * 2 * hidden + j]},
                   u = double{gup[r * 2 * hidden + hidden + j]};
      const double da = double{dap[r * hidden + j]};
      const double sig = 1.0 / (1.0 + std::exp(-g));
      store_output("swiglu_backward", dgu, r * 2 * hidden + j,
                   static_cast<float>(da * u * sig * (1.0 + g * (1.0 - sig))));
      store_output("swiglu_backward", dgu, r * 2 * hidden + hidden + j,
                   static_cast<float>(da * g * sig));
    }
}

}  // namespace moecore::kernels::reference
