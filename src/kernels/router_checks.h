// The argument checks of the router kernels, shared by every backend: logits are [N, E] and the
// options describe a choice that exists (k of E experts, groups that divide E and hold k).
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

struct RouterDims {
  int64_t tokens, experts;
};

inline RouterDims router_dims(const char* op, ConstTensorView logits, const RouterTopkOptions& o,
                              Device device = Device::kCpu) {
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [N, E], got rank {}", op, logits.rank());
  const RouterDims d{logits.size(0), logits.size(1)};
  expect_shape(op, "logits", logits, {d.tokens, d.experts}, device);
  MOE_CHECK(o.top_k >= 1 && o.top_k <= d.experts, "[{}] top_k={} must be in [1, {}]", op, o.top_k,
            d.experts);
  MOE_CHECK(o.n_group >= 1 && d.experts % o.n_group == 0,
            "[{}] n_group={} does not divide {} experts", op, o.n_group, d.experts);
  MOE_CHECK(o.topk_group >= 1 && o.topk_group <= o.n_group, "[{}] topk_group={} must be in [1, {}]",
            op, o.topk_group, o.n_group);
  MOE_CHECK(o.n_group == 1 || o.topk_group * (d.experts / o.n_group) >= o.top_k,
            "[{}] topk_group={} groups of {} experts cannot hold top_k={}", op, o.topk_group,
            d.experts / o.n_group, o.top_k);
  MOE_CHECK(o.choice == RouterChoice::kTopScores || o.token_offset >= 0,
            "[{}] routing token offset {} must be >= 0", op, o.token_offset);
  return d;
}

// router_topk_forward's outputs: scores [N, E], topk_index and topk_weight [N, k], E counts.
inline void expect_router_outputs(const char* op, const RouterDims& s, int64_t k,
                                  ConstTensorView scores, ConstTensorView topk_index,
                                  ConstTensorView topk_weight, ConstTensorView expert_counts,
                                  Device device = Device::kCpu) {
  expect_shape(op, "scores", scores, {s.tokens, s.experts}, device);
  expect_shape(op, "topk_index", topk_index, {s.tokens, k}, device);
  expect_shape(op, "topk_weight", topk_weight, {s.tokens, k}, device);
  expect_shape(op, "expert_counts", expert_counts, {s.experts}, device);
  MOE_CHECK(expert_counts.dtype() == DType::kI64, "[{}] expert_counts must be i64, got {}", op,
            dtype_name(expert_counts.dtype()));
}

// A view per group of tokens (lb_score_grad, column_sums, the groups' counts): [E] is one group
// of all N tokens, [G, E] G equal groups of consecutive tokens, G >= 1 dividing N. Returns G.
template <bool kMutable>
int64_t token_groups(const char* op, const char* name, const BasicTensorView<kMutable>& v,
                     int64_t tokens, int64_t experts, Device device = Device::kCpu) {
  MOE_CHECK(v.rank() == 1 || v.rank() == 2, "[{}] {} must be [E] or [G, E], got rank {}", op, name,
            v.rank());
  if (v.rank() == 1) {
    expect_shape(op, name, v, {experts}, device);
    return 1;
  }
  const int64_t groups = v.size(0);
  MOE_CHECK(groups >= 1 && tokens % groups == 0,
            "[{}] {} has {} groups of tokens, which do not divide {} tokens", op, name, groups,
            tokens);
  expect_shape(op, name, v, {groups, experts}, device);
  return groups;
}

// route_counts_by_group's views: topk_index [N, k] i32, counts [G, E] i64 (E >= 1, G >= 1
// dividing N).
struct GroupCountDims {
  int64_t tokens, top_k, groups, experts;
};
inline GroupCountDims group_count_dims(const char* op, ConstTensorView topk_index,
                                       ConstTensorView counts, Device device = Device::kCpu) {
  MOE_CHECK(topk_index.rank() == 2, "[{}] topk_index must be [N, k], got rank {}", op,
            topk_index.rank());
  MOE_CHECK(counts.rank() == 2, "[{}] counts must be [G, E], got rank {}", op, counts.rank());
  const GroupCountDims d{topk_index.size(0), topk_index.size(1), counts.size(0), counts.size(1)};
  expect_shape(op, "topk_index", topk_index, {d.tokens, d.top_k}, device);
  MOE_CHECK(d.experts >= 1, "[{}] counts has {} experts, expected at least one", op, d.experts);
  token_groups(op, "counts", counts, d.tokens, d.experts, device);
  MOE_CHECK(topk_index.dtype() == DType::kI32 && counts.dtype() == DType::kI64,
            "[{}] topk_index must be i32 and counts i64, got {} and {}", op,
            dtype_name(topk_index.dtype()), dtype_name(counts.dtype()));
  return d;
}

// order_routes_by_expert's views: topk_index [N, k] i32, dst_row [N * k] i32, expert_offsets
// [experts + 1] i64, experts >= 1 and N * k rows an i32 can number. Returns N * k.
inline int64_t expect_route_order_views(const char* op, ConstTensorView topk_index, int64_t experts,
                                        ConstTensorView dst_row, ConstTensorView expert_offsets,
                                        Device device = Device::kCpu) {
  MOE_CHECK(topk_index.rank() == 2, "[{}] topk_index must be [N, k], got rank {}", op,
            topk_index.rank());
  MOE_CHECK(experts >= 1, "[{}] experts={} must be positive", op, experts);
  const int64_t routes = topk_index.size(0) * topk_index.size(1);
  MOE_CHECK(routes <= std::numeric_limits<int32_t>::max(),
            "[{}] {} routes are more than an i32 row number can name", op, routes);
  expect_shape(op, "topk_index", topk_index, {topk_index.size(0), topk_index.size(1)}, device);
  expect_shape(op, "dst_row", dst_row, {routes}, device);
  expect_shape(op, "expert_offsets", expert_offsets, {experts + 1}, device);
  MOE_CHECK(topk_index.dtype() == DType::kI32 && dst_row.dtype() == DType::kI32 &&
                expert_offsets.dtype() == DType::kI64,
            "[{}] topk_index and dst_row must be i32 and expert_offsets i64, got {}, {}, {}", op,
            dtype_name(topk_index.dtype()), dtype_name(dst_row.dtype()),
            dtype_name(expert_offsets.dtype()));
  return routes;
}

// Every expert id of index [routes] (host memory) is in [0, experts).
inline void expect_expert_ids(const char* op, const int32_t* index, int64_t routes,
                              int64_t experts) {
  for (int64_t r = 0; r < routes; ++r)
    MOE_CHECK(index[r] >= 0 && index[r] < experts, "[{}] topk_index[{}]={} is outside [0, {})", op,
              r, index[r], experts);
}

}  // namespace moecore::kernels
