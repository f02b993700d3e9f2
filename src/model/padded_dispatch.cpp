#include "model/padded_dispatch.h"

#include "core/check.h"
#include "core/phase_timer.h"
#include "core/to_size.h"
#include "kernels/ops.h"

namespace moecore {

void PaddedDispatch::forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
                             int64_t tokens, const RouterState& router, RoutedRows& routed,
                             Cache& cache, Workspace& workspace) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t e_count = c.num_experts, routes = tokens * k, local = shard_.count;
  const int64_t ranks = exchange_.ranks(), capacity = padded_.capacity(routes);
  const int64_t block = padded_.block_rows(routes), slots = ranks * block;
  ScopedPhase timer(Phase::kDispatchForward);
  Workspace::Scope scratch(workspace);
  // The send order (by expert, token order within), every rank's counts, and the plan.
  routed.send_pos.resize(to_size(routes));
  const std::span<int64_t> starts = scratch.uninitialized<int64_t>(e_count + 1);
  kernels::order_routes_by_expert(view(router.topk_index.data(), {tokens, k}), e_count,
                                  view(routed.send_pos.data(), {routes}),
                                  view(starts.data(), {e_count + 1}));
  const std::span<int64_t> requests = scratch.uninitialized<int64_t>(ranks * e_count);
  padded_.gather_counts(router.expert_counts.data(), requests.data(), e_count);
  cache.slot_of_position.resize_for_overwrite(to_size(routes));
  cache.position_of_slot.resize_for_overwrite(to_size(slots));
  cache.token_of_slot.resize_for_overwrite(to_size(slots));
  cache.row_of_slot.resize_for_overwrite(to_size(slots));
  cache.slot_of_row.resize_for_overwrite(to_size(capacity));
  cache.dropped.resize_for_overwrite(1);
  ExpertRows& rows = cache.experts;
  rows.expert_offsets.resize_for_overwrite(to_size(local + 1));
  rows.received = capacity;  // the static size; the offsets say how many rows are kept
  kernels::padded_dispatch_plan(
      view(requests.data(), {ranks, e_count}), view(router.topk_index.data(), {tokens, k}),
      view(routed.send_pos.data(), {routes}), view(starts.data(), {e_count + 1}),
      {exchange_.rank(), ranks, local, capacity, block},
      {view(cache.slot_of_position.data(), {routes}), view(cache.position_of_slot.data(), {slots}),
       view(cache.token_of_slot.data(), {slots}), view(cache.row_of_slot.data(), {slots}),
       view(cache.slot_of_row.data(), {capacity}), view(rows.expert_offsets.data(), {local + 1}),
       view(cache.dropped.data(), {1})});

  // The blocks out and in, the kept rows into the experts' buffer (zero past them).
  const std::span<float> sent = scratch.uninitialized<float>(slots * d);
  const std::span<float> received = scratch.uninitialized<float>(slots * d);
  kernels::gather_rows(view(x, {tokens, d}), view(cache.token_of_slot.data(), {slots}),
                       view(sent.data(), {slots, d}));
  padded_.exchange_blocks(sent.data(), received.data(), block, d);
  rows.x.resize_for_overwrite(to_size(capacity * d));
  kernels::gather_rows(view(received.data(), {slots, d}),
                       view(cache.slot_of_row.data(), {capacity}),
                       view(rows.x.data(), {capacity, d}));

  timer.switch_to(Phase::kExpertsForward);
  cache.y_perm.resize(to_size(capacity * d));
  grouped_experts_forward(precision, config_, local, w, rows, cache.y_perm.data());

  // Outputs back to their sources, in send order; dropped routes' rows zero.
  timer.switch_to(Phase::kCombineForward);
  kernels::gather_rows(view(cache.y_perm.data(), {capacity, d}),
                       view(cache.row_of_slot.data(), {slots}), view(sent.data(), {slots, d}));
  padded_.exchange_blocks(sent.data(), received.data(), block, d);
  routed.y_back.resize_for_overwrite(to_size(routes * d));
  kernels::gather_rows(view(received.data(), {slots, d}),
                       view(cache.slot_of_position.data(), {routes}),
                       view(routed.y_back.data(), {routes, d}));
}

void PaddedDispatch::backward(const PrecisionRecipe& precision, const MoeWeights& w,
                              const MoeGrads& dw, const Cache& cache, const float* dy_send,
                              float* dx_send, Workspace& workspace) const {
  const int64_t d = config_.hidden_size, local = shard_.count;
  const int64_t routes = static_cast<int64_t>(cache.slot_of_position.size());
  const int64_t capacity = padded_.capacity(routes), block = padded_.block_rows(routes);
  const int64_t slots = exchange_.ranks() * block;
  // Output gradients along the forward's path to the experts' rows (zero past those kept).
  ScopedPhase timer(Phase::kDispatchBackward);
  Workspace::Scope scratch(workspace);
  const std::span<float> sent = scratch.uninitialized<float>(slots * d);
  const std::span<float> received = scratch.uninitialized<float>(slots * d);
  kernels::gather_rows(view(dy_send, {routes, d}), view(cache.position_of_slot.data(), {slots}),
                       view(sent.data(), {slots, d}));
  padded_.exchange_blocks(sent.data(), received.data(), block, d);
  const std::span<float> dy_rows = scratch.uninitialized<float>(capacity * d);
  kernels::gather_rows(view(received.data(), {slots, d}),
                       view(cache.slot_of_row.data(), {capacity}),
                       view(dy_rows.data(), {capacity, d}));

  const std::span<float> dx_rows = scratch.zeroed<float>(capacity * d);
  timer.switch_to(Phase::kExpertsBackward);
  grouped_experts_backward(precision, config_, local, w, dw, cache.experts, dy_rows.data(),
                           dx_rows.data(), workspace);

  // Input gradients back to their sources, in send order; dropped routes get zero.
  timer.switch_to(Phase::kCombineBackward);
  kernels::gather_rows(view(dx_rows.data(), {capacity, d}), view(cache.row_of_slot.data(), {slots}),
                       view(sent.data(), {slots, d}));
  padded_.exchange_blocks(sent.data(), received.data(), block, d);
  kernels::gather_rows(view(received.data(), {slots, d}),
                       view(cache.slot_of_position.data(), {routes}), view(dx_send, {routes, d}));
}

}  // namespace moecore
