// The MoE combine on the CPU: tokens over the OpenMP pool; a token's routes are added in slot
// order, so the result does not depend on the thread count.
#include "kernels/combine_checks.h"
#include "kernels/cpu/ops.h"

namespace moecore::kernels::cpu {

namespace {

// The shapes, and every row number inside routed.
CombineShape checked_combine_shape(const char* op, ConstTensorView routed,
                                   ConstTensorView route_row, ConstTensorView weights) {
  const CombineShape s = combine_shape(op, routed, route_row, weights);
  const int32_t* rows = route_row.data<int32_t>(op);
  for (int64_t r = 0; r < s.tokens * s.k; ++r)
    MOE_CHECK(rows[r] >= 0 && rows[r] < routed.size(0), "[{}] route_row[{}]={} is outside [0, {})",
              op, r, rows[r], routed.size(0));
  return s;
}

}  // namespace

void moe_combine_forward(ConstTensorView routed, ConstTensorView route_row, ConstTensorView weights,
                         TensorView y) {
  constexpr const char* kOp = "moe_combine";
  const CombineShape s = checked_combine_shape(kOp, routed, route_row, weights);
  expect_shape(kOp, "y", y, {s.tokens, s.d});
  const float* out = routed.data<float>(kOp);
  const int32_t* rows = route_row.data<int32_t>(kOp);
  const float* w = weights.data<float>(kOp);
  float* yp = y.data<float>(kOp);
  const int64_t k = s.k, d = s.d;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* yt = yp + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const float weight = w[t * k + j];
      const float* src = out + rows[t * k + j] * d;
      for (int64_t i = 0; i < d; ++i) yt[i] += weight * src[i];
    }
  }
}

void moe_combine_backward(ConstTensorView dy, ConstTensorView routed, ConstTensorView route_row,
                          ConstTensorView weights, TensorView d_routed, TensorView d_weights) {
  constexpr const char* kOp = "moe_combine_backward";
  const CombineShape s = checked_combine_shape(kOp, routed, route_row, weights);
  expect_shape(kOp, "dy", dy, {s.tokens, s.d});
  expect_shape(kOp, "d_routed", d_routed, {routed.size(0), s.d});
  expect_shape(kOp, "d_weights", d_weights, {s.tokens, s.k});
  const float* dyp = dy.data<float>(kOp);
  const float* out = routed.data<float>(kOp);
  const int32_t* rows = route_row.data<int32_t>(kOp);
  const float* w = weights.data<float>(kOp);
  float* g = d_routed.data<float>(kOp);
  float* dw = d_weights.data<float>(kOp);
  const int64_t k = s.k, d = s.d;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* dyt = dyp + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = t * k + j;
      const float weight = w[r];
      const float* o = out + rows[r] * d;
      float* gr = g + rows[r] * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        gr[i] = weight * dyt[i];
        dot += dyt[i] * o[i];
      }
      dw[r] = dot;
    }
  }
}

}  // namespace moecore::kernels::cpu
