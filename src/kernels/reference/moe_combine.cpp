// The MoE combine, the plain-loop oracle, in double.
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void moe_combine_forward(ConstTensorView routed, ConstTensorView route_row, ConstTensorView weights,
                         TensorView y) {
  const int64_t tokens = route_row.size(0), k = route_row.size(1), d = routed.size(1);
  const float* out = routed.data<float>("moe_combine");
  const int32_t* rows = route_row.data<int32_t>("moe_combine");
  const float* w = weights.data<float>("moe_combine");
  float* yp = y.data<float>("moe_combine");
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < d; ++i) {
      double sum = double{yp[t * d + i]};
      for (int64_t j = 0; j < k; ++j)
        sum += double{w[t * k + j]} * double{out[rows[t * k + j] * d + i]};
      yp[t * d + i] = static_cast<float>(sum);
    }
}

void moe_combine_backward(ConstTensorView dy, ConstTensorView routed, ConstTensorView route_row,
                          ConstTensorView weights, TensorView d_routed, TensorView d_weights) {
  const int64_t tokens = route_row.size(0), k = route_row.size(1), d = routed.size(1);
  const float* dyp = dy.data<float>("moe_combine_backward");
  const float* out = routed.data<float>("moe_combine_backward");
  const int32_t* rows = route_row.data<int32_t>("moe_combine_backward");
  const float* w = weights.data<float>("moe_combine_backward");
  float* g = d_routed.data<float>("moe_combine_backward");
  float* dw = d_weights.data<float>("moe_combine_backward");
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = t * k + j;
      double dot = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        g[rows[r] * d + i] = static_cast<float>(double{w[r]} * double{dyp[t * d + i]});
        dot += double{dyp[t * d + i]} * double{out[rows[r] * d + i]};
      }
      dw[r] = static_cast<float>(dot);
    }
}

}  // namespace moecore::kernels::reference
