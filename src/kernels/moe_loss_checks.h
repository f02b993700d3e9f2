// The argument checks of moe_loss_terms and router_bias_update, shared by every backend.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

struct MoeLossDims {
  int64_t layers, experts, groups, head_chunks;
};

// G = o.lb_groups: route_counts [L, G E], router_sums [L, G E + 1], head_losses [C, kHeadLosses],
// losses [kLossParts], lb_score_grad [L, G E], route_tally [L, E] or not given; the dtypes of
// kernels/ops.h; normalisers >= 0; G >= 1, 1 for lb_over_all_layers.
inline MoeLossDims moe_loss_dims(const char* op, ConstTensorView route_counts,
                                 ConstTensorView router_sums, ConstTensorView head_losses,
                                 const MoeLossOptions& o, ConstTensorView losses,
                                 ConstTensorView lb_score_grad, ConstTensorView route_tally,
                                 Device device = Device::kCpu) {
  MOE_CHECK(route_counts.rank() == 2, "[{}] route_counts must be [L, G E], got rank {}", op,
            route_counts.rank());
  MOE_CHECK(head_losses.rank() == 2, "[{}] head_losses must be [C, {}], got rank {}", op,
            kHeadLosses, head_losses.rank());
  MOE_CHECK(o.lb_groups >= 1, "[{}] lb_groups={} must be positive", op, o.lb_groups);
  MOE_CHECK(o.lb_groups == 1 || !o.lb_over_all_layers,
            "[{}] the load-balancing loss over all layers has one group of tokens, got {}", op,
            o.lb_groups);
  const int64_t row = route_counts.size(1);
  MOE_CHECK(row % o.lb_groups == 0,
            "[{}] route_counts has {} values per layer, not a row of experts for each of {} "
            "groups",
            op, row, o.lb_groups);
  const MoeLossDims d{route_counts.size(0), row / o.lb_groups, o.lb_groups, head_losses.size(0)};
  expect_shape(op, "route_counts", route_counts, {d.layers, row}, device);
  expect_shape(op, "router_sums", router_sums, {d.layers, row + 1}, device);
  expect_shape(op, "head_losses", head_losses, {d.head_chunks, kHeadLosses}, device);
  expect_shape(op, "losses", losses, {kLossParts}, device);
  expect_shape(op, "lb_score_grad", lb_score_grad, {d.layers, row}, device);
  if (view_given(route_tally))
    expect_shape(op, "route_tally", route_tally, {d.layers, d.experts}, device);
  MOE_CHECK(route_counts.dtype() == DType::kI64, "[{}] route_counts must be i64, got {}", op,
            dtype_name(route_counts.dtype()));
  for (const ConstTensorView& v : {router_sums, head_losses, losses})
    MOE_CHECK(v.dtype() == DType::kF64, "[{}] statistics and losses are f64, got {}", op,
              dtype_name(v.dtype()));
  MOE_CHECK(lb_score_grad.dtype() == DType::kF32, "[{}] lb_score_grad must be f32, got {}", op,
            dtype_name(lb_score_grad.dtype()));
  MOE_CHECK(!view_given(route_tally) || route_tally.dtype() == DType::kF64,
            "[{}] route_tally must be f64, got {}", op, dtype_name(route_tally.dtype()));
  MOE_CHECK(d.layers == 0 || (o.top_k >= 1 && o.top_k <= d.experts),
            "[{}] top_k={} must be in [1, {}]", op, o.top_k, d.experts);
  MOE_CHECK(o.router_loss_div >= 0.0 && o.tokens >= 0.0 && o.z_rows >= 0.0,
            "[{}] normalisers must be >= 0 (router_loss_div {}, tokens {}, z_rows {})", op,
            o.router_loss_div, o.tokens, o.z_rows);
  return d;
}

// counts [E] f64, bias [E] f32; returns E.
inline int64_t router_bias_update_experts(const char* op, ConstTensorView counts, TensorView bias,
                                          Device device = Device::kCpu) {
  MOE_CHECK(counts.rank() == 1, "[{}] counts must be [E], got rank {}", op, counts.rank());
  const int64_t experts = counts.size(0);
  expect_shape(op, "counts", counts, {experts}, device);
  expect_shape(op, "bias", bias, {experts}, device);
  MOE_CHECK(counts.dtype() == DType::kF64, "[{}] counts must be f64, got {}", op,
            dtype_name(counts.dtype()));
  MOE_CHECK(bias.dtype() == DType::kF32, "[{}] bias must be f32, got {}", op,
            dtype_name(bias.dtype()));
  return experts;
}

}  // namespace moecore::kernels
