#include "model/sync_dispatch.h"

#include <numeric>

#include "core/check.h"
#include "core/phase_timer.h"
#include "core/to_size.h"
#include "kernels/ops.h"

namespace moecore {

namespace {

// The capacity form's kept routes as send-order rows: expert e's routes sit at
// [start_e, start_e + counts[e]) of the send order (by expert, token order within), and its
// first sent[e] travel.
void plan_kept_rows(const std::vector<int64_t>& counts, const std::vector<int64_t>& sent,
                    std::vector<int32_t>& rows) {
  rows.clear();
  int64_t start = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int64_t i = 0; i < sent[e]; ++i) rows.push_back(static_cast<int32_t>(start + i));
    start += counts[e];
  }
}

}  // namespace

void SyncDispatch::forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
                           int64_t tokens, const RouterState& router, RoutedRows& routed,
                           Cache& cache, Workspace& workspace) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, e_count = c.num_experts;
  const int64_t routes = tokens * k;
  const int64_t ranks = exchange_.ranks(), local = shard_.count;
  // The plan (counts, offsets, the receive-side permutation) is made on the host from the
  // exchanged counts; the rows stay where the model's tensors are, and the exchange moves them
  // there (dist::Communicator stages a device's buffers for MPI, NCCL takes them as they are).
  ScopedPhase timer(Phase::kDispatchForward);
  Workspace::Scope scratch(workspace);
  // The send order: by global expert, so by destination rank (expert e sits on rank e / local).
  routed.send_pos.resize(to_size(routes));
  kernels::order_routes_by_expert(
      view(router.topk_index.data(), {tokens, k}), e_count, view(routed.send_pos.data(), {routes}),
      view(scratch.uninitialized<int64_t>(e_count + 1).data(), {e_count + 1}));
  const std::vector<int64_t> expert_counts = host_copy(router.expert_counts);

  // What travels: every route with its counts exchanged, or the capacity's keep decision.
  std::vector<int64_t> sent_counts;
  if (capacity_ != nullptr) {
    RowwiseBlocks blocks = capacity_->blocks(expert_counts, routes, local);
    sent_counts = std::move(blocks.sent);
    cache.recv_counts = std::move(blocks.received);
    cache.dropped_routes = blocks.dropped;
  } else {
    sent_counts = expert_counts;
    exchange_.exchange_counts(expert_counts, cache.recv_counts, local);
    cache.dropped_routes = 0;
  }
  cache.send_rows.assign(to_size(ranks), 0);
  for (int64_t e = 0; e < e_count; ++e)
    cache.send_rows[to_size(e / local)] += sent_counts[to_size(e)];
  const int64_t sent = std::accumulate(cache.send_rows.begin(), cache.send_rows.end(), int64_t{0});
  const bool drops = cache.dropped_routes > 0;
  cache.kept_rows_plan.clear();
  if (drops) plan_kept_rows(expert_counts, sent_counts, cache.kept_rows_plan);
  cache.kept_rows.resize_for_overwrite(cache.kept_rows_plan.size());
  copy_bytes(cache.kept_rows.data(), cache.kept_rows_plan.data(),
             cache.kept_rows_plan.size() * sizeof(int32_t));

  const std::span<float> x_send = scratch.uninitialized<float>(sent * d);
  if (!drops) {
    kernels::permute_rows(view(x, {tokens, d}), view(routed.send_pos.data(), {routes}), k,
                          view(x_send.data(), {routes, d}));
  } else if (sent > 0) {
    const std::span<float> x_sorted = scratch.uninitialized<float>(routes * d);
    kernels::permute_rows(view(x, {tokens, d}), view(routed.send_pos.data(), {routes}), k,
                          view(x_sorted.data(), {routes, d}));
    kernels::gather_rows(view(x_sorted.data(), {routes, d}), view(cache.kept_rows.data(), {sent}),
                         view(x_send.data(), {sent, d}));
  }

  // Rows per (source, local expert): their sums per source and the expert offsets.
  cache.recv_rows.assign(to_size(ranks), 0);
  std::vector<int64_t> offsets(to_size(local + 1), 0);
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < local; ++le) {
      cache.recv_rows[to_size(src)] += cache.recv_counts[to_size(src * local + le)];
      offsets[to_size(le + 1)] += cache.recv_counts[to_size(src * local + le)];
    }
  for (int64_t le = 0; le < local; ++le) offsets[to_size(le + 1)] += offsets[to_size(le)];
  cache.experts.set_offsets(offsets);
  const int64_t received = cache.experts.received;
  // One receive buffer: the token rows, then (once they sit expert-major in the cache) the outputs
  // on their way back.
  const std::span<float> x_recv = scratch.uninitialized<float>(received * d);
  exchange_.exchange_rows(x_send.data(), cache.send_rows, x_recv.data(), cache.recv_rows, d);

  // Received rows come source-major; the grouped GEMM wants them expert-major.
  cache.recv_to_expert_plan.resize(to_size(received));
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  int64_t row = 0;
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < local; ++le)
      for (int64_t i = 0; i < cache.recv_counts[to_size(src * local + le)]; ++i)
        cache.recv_to_expert_plan[to_size(row++)] = static_cast<int32_t>(fill[to_size(le)]++);
  cache.recv_to_expert.resize_for_overwrite(to_size(received));
  copy_bytes(cache.recv_to_expert.data(), cache.recv_to_expert_plan.data(),
             to_size(received) * sizeof(int32_t));
  cache.experts.x.resize(to_size(received * d));
  cache.y_perm.resize(to_size(received * d));
  const ConstTensorView to_expert = view(cache.recv_to_expert.data(), {received});
  kernels::permute_rows(view(x_recv.data(), {received, d}), to_expert, 1,
                        view(cache.experts.x.data(), {received, d}));

  timer.switch_to(Phase::kExpertsForward);
  grouped_experts_forward(precision, config_, local, w, cache.experts, cache.y_perm.data());

  // Outputs back to their sources, in send order; dropped routes' rows zero.
  timer.switch_to(Phase::kCombineForward);
  const std::span<float> y_recv = x_recv;
  kernels::gather_rows(view(cache.y_perm.data(), {received, d}), to_expert,
                       view(y_recv.data(), {received, d}));
  routed.y_back.resize(to_size(routes * d));
  if (!drops) {
    exchange_.exchange_rows(y_recv.data(), cache.recv_rows, routed.y_back.data(), cache.send_rows,
                            d);
    return;
  }
  const std::span<float> y_kept = x_send;
  exchange_.exchange_rows(y_recv.data(), cache.recv_rows, y_kept.data(), cache.send_rows, d);
  routed.y_back.zero();
  if (sent > 0)
    kernels::permute_rows(view(y_kept.data(), {sent, d}), view(cache.kept_rows.data(), {sent}), 1,
                          view(routed.y_back.data(), {routes, d}));
}

void SyncDispatch::backward(const PrecisionRecipe& precision, const MoeWeights& w,
                            const MoeGrads& dw, const Cache& cache, const float* dy_send,
                            float* dx_send, Workspace& workspace) const {
  const int64_t d = config_.hidden_size;
  const int64_t local = shard_.count;
  const int64_t received = cache.experts.received;
  const int64_t sent = std::accumulate(cache.send_rows.begin(), cache.send_rows.end(), int64_t{0});
  const int64_t routes = sent + cache.dropped_routes;
  const bool drops = cache.dropped_routes > 0;
  // Output gradients travel to the experts along the forward path (only the kept routes'),
  // expert-major there.
  ScopedPhase timer(Phase::kDispatchBackward);
  Workspace::Scope scratch(workspace);
  const float* dy_sent = dy_send;
  const std::span<float> sent_rows = scratch.uninitialized<float>(drops ? sent * d : 0);
  if (drops) {
    if (sent > 0)
      kernels::gather_rows(view(dy_send, {routes, d}), view(cache.kept_rows.data(), {sent}),
                           view(sent_rows.data(), {sent, d}));
    dy_sent = sent_rows.data();
  }
  const std::span<float> dy_recv = scratch.zeroed<float>(received * d);
  const std::span<float> dy_perm = scratch.zeroed<float>(received * d);
  exchange_.exchange_rows(dy_sent, cache.send_rows, dy_recv.data(), cache.recv_rows, d);
  const ConstTensorView to_expert = view(cache.recv_to_expert.data(), {received});
  kernels::permute_rows(view(dy_recv.data(), {received, d}), to_expert, 1,
                        view(dy_perm.data(), {received, d}));

  const std::span<float> dx_perm = scratch.zeroed<float>(received * d);
  timer.switch_to(Phase::kExpertsBackward);
  grouped_experts_backward(precision, config_, local, w, dw, cache.experts, dy_perm.data(),
                           dx_perm.data(), workspace);
  timer.switch_to(Phase::kCombineBackward);

  // Input gradients back to the source; dx[t] = sum over its routes (the combine's backward).
  const std::span<float> dx_recv = scratch.zeroed<float>(received * d);
  kernels::gather_rows(view(dx_perm.data(), {received, d}), to_expert,
                       view(dx_recv.data(), {received, d}));
  if (!drops) {
    exchange_.exchange_rows(dx_recv.data(), cache.recv_rows, dx_send, cache.send_rows, d);
    return;
  }
  exchange_.exchange_rows(dx_recv.data(), cache.recv_rows, sent_rows.data(), cache.send_rows, d);
  zero_bytes(dx_send, to_size(routes * d) * sizeof(float));
  if (sent > 0)
    kernels::permute_rows(view(sent_rows.data(), {sent, d}), view(cache.kept_rows.data(), {sent}),
                          1, view(dx_send, {routes, d}));
}

}  // namespace moecore
