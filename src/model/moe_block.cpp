#include "model/moe_block.h"

#include <omp.h>

#include <algorithm>

#include "core/check.h"
#include "core/phase_timer.h"
#include "kernels/ops.h"
#include "model/swiglu_mlp.h"

namespace moecore {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// The grouped GEMM runs in one of two ways. With many rows per expert, one expert at a time with
// multithreaded GEMMs. With few (128 experts top-4 on 2048 tokens: ~64 rows each), each such GEMM
// is too small to split over the threads; its thread start-up and barriers cost more than the work.
// Then the experts run in parallel instead, each on one thread (oneDNN runs single-threaded inside
// a parallel region, as does the SwiGLU's elementwise loop), biggest first so that the threads
// finish together. Either way each expert's rows see the same per-row arithmetic.
constexpr int64_t kRowsPerThreadedExpert = 256;

// Local experts with rows, biggest first; empty when one expert at a time is the better choice.
std::vector<int64_t> parallel_expert_order(const std::vector<int64_t>& offsets, int64_t local) {
  std::vector<int64_t> order;
  for (int64_t le = 0; le < local; ++le)
    if (offsets[at(le + 1)] > offsets[at(le)]) order.push_back(le);
  const int64_t threads = omp_get_max_threads();
  if (threads <= 1 || order.size() < 2 || omp_in_parallel() != 0) return {};
  const int64_t rows = offsets[at(local)];
  if (rows >= kRowsPerThreadedExpert * static_cast<int64_t>(order.size())) return {};
  auto rows_of = [&](int64_t le) { return offsets[at(le + 1)] - offsets[at(le)]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows_of(a) > rows_of(b); });
  return order;
}

// Runs expert(le) for every local expert with rows, in whichever way parallel_expert_order picks.
template <typename F>
void for_each_expert(const std::vector<int64_t>& offsets, int64_t local, F&& expert) {
  const std::vector<int64_t> order = parallel_expert_order(offsets, local);
  if (order.empty()) {
    for (int64_t le = 0; le < local; ++le)
      if (offsets[at(le + 1)] > offsets[at(le)]) expert(le);
    return;
  }
  const int64_t n = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) expert(order[at(i)]);
}

// The grouped GEMM: one SwiGLU MLP per local expert over its contiguous rows of expert-major
// buffers (inputs in cache.x_perm; saves gu/act in the cache). Experts without rows are skipped.
void grouped_experts_forward(const ModelConfig& c, int64_t local, const MoeWeights& w,
                             MoeCache& cache, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  for_each_expert(cache.expert_offsets, local, [&](int64_t le) {
    const int64_t begin = cache.expert_offsets[at(le)];
    const int64_t rows = cache.expert_offsets[at(le + 1)] - begin;
    swiglu_mlp_forward({rows, d, h}, cache.x_perm.data() + begin * d,
                       w.experts_gate_up + le * 2 * h * d, w.experts_down + le * d * h,
                       cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                       y + begin * d);
  });
}

// Its backward: dy -> dx over the same expert-major rows; expert weight gradients += into dw.
// Experts write disjoint rows of dx and the scratch, and disjoint weight gradients.
void grouped_experts_backward(const ModelConfig& c, int64_t local, const MoeWeights& w,
                              const MoeWeights& dw, const MoeCache& cache, const float* dy,
                              float* dx) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = cache.expert_offsets[at(local)];
  std::vector<float> scratch_dact(at(received * h));
  std::vector<float> scratch_dgu(at(received * 2 * h));
  for_each_expert(cache.expert_offsets, local, [&](int64_t le) {
    const int64_t begin = cache.expert_offsets[at(le)];
    const int64_t rows = cache.expert_offsets[at(le + 1)] - begin;
    swiglu_mlp_backward({rows, d, h}, dy + begin * d, cache.x_perm.data() + begin * d,
                        w.experts_gate_up + le * 2 * h * d, w.experts_down + le * d * h,
                        cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                        dx + begin * d, dw.experts_gate_up + le * 2 * h * d,
                        dw.experts_down + le * d * h, scratch_dact.data() + begin * h,
                        scratch_dgu.data() + begin * 2 * h, false);
  });
}

}  // namespace

MoeBlock::MoeBlock(const ModelConfig& config, ExpertShard shard, const ExpertExchange* exchange)
    : config_(config),
      shard_(shard),
      exchange_(exchange != nullptr ? exchange : &local_),
      rowwise_(exchange_->rowwise()) {
  MOE_CHECK(shard_.count * exchange_->ranks() == config.num_experts &&
                shard_.first == exchange_->rank() * shard_.count,
            "[moe] {} ranks holding {} experts each (from {}) do not cover num_experts={}",
            exchange_->ranks(), shard_.count, shard_.first, config.num_experts);
}

void MoeBlock::forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
                       MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  cache.router_shape = router_shape_of(c, tokens);
  cache.router.selection.bias = w.router_bias;
  ScopedPhase timer(Phase::kRouterForward);
  router_forward(cache.router_shape, x, w.router, cache.router);
  timer.stop();  // the dispatch paths time their own phases
  if (rowwise_ != nullptr) {
    experts_forward_rowwise(w, x, tokens, cache);
  } else {
    experts_forward_sync(w, x, tokens, cache);
  }

  const int64_t hs = c.shared_expert_intermediate_size;
  timer.switch_to(Phase::kSharedExpertForward);
  if (hs > 0) {
    cache.shared_gu.resize(at(tokens * 2 * hs));
    cache.shared_act.resize(at(tokens * hs));
    swiglu_mlp_forward({tokens, d, hs}, x, w.shared_gate_up, w.shared_down, cache.shared_gu.data(),
                       cache.shared_act.data(), y);
  } else {
    std::fill(y, y + tokens * d, 0.0f);
  }
  // Combine: y[t] += sum_j weight[t, j] * output of route (t, j).
  timer.switch_to(Phase::kCombineForward);
  kernels::moe_combine_forward(
      view(cache.y_back.data(), {tokens * k, d}), view(cache.send_pos.data(), {tokens, k}),
      view(cache.router.topk_weight.data(), {tokens, k}), view(y, {tokens, d}));
}

void MoeBlock::experts_forward_sync(const MoeWeights& w, const float* x, int64_t tokens,
                                    MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, e_count = c.num_experts;
  const int64_t h = c.moe_intermediate_size, routes = tokens * k;
  const int64_t ranks = exchange_->ranks(), local = shard_.count;
  ScopedPhase timer(Phase::kDispatchForward);
  cache.targets.clear();
  cache.dropped_routes = 0;

  // Send order: destination rank, then its expert, then token (global expert id e sits on rank
  // e / local as its expert e % local, so ordering by e is exactly that).
  std::vector<int64_t> cursor(at(e_count + 1), 0);
  for (int64_t e = 0; e < e_count; ++e)
    cursor[at(e + 1)] = cursor[at(e)] + cache.router.expert_counts[at(e)];
  cache.send_rows.assign(at(ranks), 0);
  for (int64_t e = 0; e < e_count; ++e)
    cache.send_rows[at(e / local)] += cache.router.expert_counts[at(e)];
  cache.send_pos.resize(at(routes));
  for (int64_t r = 0; r < routes; ++r)
    cache.send_pos[at(r)] = static_cast<int32_t>(cursor[at(cache.router.topk_index[at(r)])]++);
  if (ranks == 1) {
    timer.stop();  // it times its own phases
    experts_forward_single_rank(w, x, tokens, cursor, cache);
    return;
  }
  std::vector<float> x_send(at(routes * d));
  kernels::permute_rows(view(x, {tokens, d}), view(cache.send_pos.data(), {routes}), k,
                        view(x_send.data(), {routes, d}));

  // Counts per (source, local expert), then the rows.
  exchange_->exchange_counts(cache.router.expert_counts, cache.recv_counts, local);
  cache.recv_rows.assign(at(ranks), 0);
  cache.expert_offsets.assign(at(local + 1), 0);
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < local; ++le) {
      cache.recv_rows[at(src)] += cache.recv_counts[at(src * local + le)];
      cache.expert_offsets[at(le + 1)] += cache.recv_counts[at(src * local + le)];
    }
  for (int64_t le = 0; le < local; ++le)
    cache.expert_offsets[at(le + 1)] += cache.expert_offsets[at(le)];
  const int64_t received = cache.expert_offsets[at(local)];
  std::vector<float> x_recv(at(received * d));
  exchange_->exchange_rows(x_send.data(), cache.send_rows, x_recv.data(), cache.recv_rows, d);

  // Received rows come source-major; the grouped GEMM wants them expert-major.
  cache.recv_to_expert.resize(at(received));
  std::vector<int64_t> fill(cache.expert_offsets.begin(), cache.expert_offsets.end() - 1);
  int64_t row = 0;
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < local; ++le)
      for (int64_t i = 0; i < cache.recv_counts[at(src * local + le)]; ++i)
        cache.recv_to_expert[at(row++)] = static_cast<int32_t>(fill[at(le)]++);
  cache.x_perm.resize(at(received * d));
  cache.gu_perm.resize(at(received * 2 * h));
  cache.act_perm.resize(at(received * h));
  cache.y_perm.resize(at(received * d));
  const ConstTensorView to_expert = view(cache.recv_to_expert.data(), {received});
  kernels::permute_rows(view(x_recv.data(), {received, d}), to_expert, 1,
                        view(cache.x_perm.data(), {received, d}));

  timer.switch_to(Phase::kExpertsForward);
  grouped_experts_forward(config_, local, w, cache, cache.y_perm.data());

  // Outputs back to their sources, in send order.
  timer.switch_to(Phase::kCombineForward);
  std::vector<float> y_recv(at(received * d));
  kernels::gather_rows(view(cache.y_perm.data(), {received, d}), to_expert,
                       view(y_recv.data(), {received, d}));
  cache.y_back.resize(at(routes * d));
  exchange_->exchange_rows(y_recv.data(), cache.recv_rows, cache.y_back.data(), cache.send_rows, d);
}

// One rank holds every expert: the send order (by expert, then token) is already the experts'
// expert-major input order, so the token rows are gathered straight into x_perm and the outputs
// are read in place; nothing is exchanged or permuted again.
void MoeBlock::experts_forward_single_rank(const MoeWeights& w, const float* x, int64_t tokens,
                                           const std::vector<int64_t>& expert_ends,
                                           MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, h = c.moe_intermediate_size;
  const int64_t routes = tokens * k, e_count = c.num_experts;
  ScopedPhase timer(Phase::kDispatchForward);
  // Nothing is exchanged: no row counts per rank, no receive-side permutation.
  cache.send_rows.clear();
  cache.recv_counts.clear();
  cache.recv_rows.clear();
  cache.recv_to_expert.clear();
  cache.expert_offsets.assign(at(e_count + 1), 0);
  // After the send_pos pass, expert_ends[e] is where expert e's rows end: its next expert's start.
  for (int64_t e = 0; e < e_count; ++e) cache.expert_offsets[at(e + 1)] = expert_ends[at(e)];
  cache.x_perm.resize(at(routes * d));
  cache.gu_perm.resize(at(routes * 2 * h));
  cache.act_perm.resize(at(routes * h));
  kernels::permute_rows(view(x, {tokens, d}), view(cache.send_pos.data(), {routes}), k,
                        view(cache.x_perm.data(), {routes, d}));
  timer.switch_to(Phase::kExpertsForward);
  cache.y_back.resize(at(routes * d));
  grouped_experts_forward(config_, e_count, w, cache, cache.y_back.data());
  cache.y_perm.clear();
}

void MoeBlock::experts_forward_rowwise(const MoeWeights& w, const float* x, int64_t tokens,
                                       MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, h = c.moe_intermediate_size;
  const int64_t routes = tokens * k, local = shard_.count;
  ScopedPhase timer(Phase::kDispatchForward);
  // Buffers at the source stay in route order; the plan says where each route's row goes.
  cache.send_pos.resize(at(routes));
  for (int64_t r = 0; r < routes; ++r) cache.send_pos[at(r)] = static_cast<int32_t>(r);
  RowwisePlan plan =
      rowwise_->plan(cache.router.expert_counts, cache.router.topk_index.data(), routes, local, d);
  cache.targets = std::move(plan.targets);
  cache.expert_offsets = std::move(plan.expert_offsets);
  cache.dropped_routes = plan.dropped;
  cache.send_rows.clear();
  cache.recv_counts.clear();
  cache.recv_rows.clear();
  cache.recv_to_expert.clear();
  cache.y_perm.clear();

  // Token rows straight into the destinations' expert-major input buffers; ours is then complete.
  rowwise_->put_rows(x, k, cache.targets, d);
  const int64_t received = cache.expert_offsets[at(local)];
  const float* x_in = rowwise_->input();
  float* y_out = rowwise_->output();
  // The backward needs the inputs after later layers have reused the buffer: a plain copy.
  cache.x_perm.assign(x_in, x_in + received * d);
  cache.gu_perm.resize(at(received * 2 * h));
  cache.act_perm.resize(at(received * h));
  timer.switch_to(Phase::kExpertsForward);
  grouped_experts_forward(config_, local, w, cache, y_out);
  timer.switch_to(Phase::kCombineForward);
  // Each kept route's output fetched from its destination; dropped routes contribute zero.
  cache.y_back.assign(at(routes * d), 0.0f);
  rowwise_->get_rows(cache.y_back.data(), cache.targets, d);
}

void MoeBlock::backward(const MoeWeights& w, const MoeWeights& dw, const float* x, const float* dy,
                        const MoeCache& cache, const float* lb_score_grad, bool lb_uses_softmax,
                        float z_grad_scale, float* dx) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t tokens = cache.router_shape.tokens, routes = tokens * k;

  // Combine backward at the source: d output(t, j) = weight * dy[t]; d weight = <dy[t], output>.
  ScopedPhase timer(Phase::kCombineBackward);
  std::vector<float> dy_send(at(routes * d));
  std::vector<float> d_weight(at(routes));
  kernels::moe_combine_backward(
      view(dy, {tokens, d}), view(cache.y_back.data(), {routes, d}),
      view(cache.send_pos.data(), {tokens, k}), view(cache.router.topk_weight.data(), {tokens, k}),
      view(dy_send.data(), {routes, d}), view(d_weight.data(), {tokens, k}));

  std::vector<float> dx_send(at(routes * d));
  timer.stop();  // the dispatch paths time their own phases
  if (rowwise_ != nullptr) {
    experts_backward_rowwise(w, dw, cache, dy_send, dx_send);
  } else {
    experts_backward_sync(w, dw, cache, dy_send, dx_send);
  }
  timer.switch_to(Phase::kCombineBackward);
  kernels::permute_rows_backward(view(dx_send.data(), {routes, d}),
                                 view(cache.send_pos.data(), {routes}), k, view(dx, {tokens, d}));

  const int64_t hs = c.shared_expert_intermediate_size;
  timer.switch_to(Phase::kSharedExpertBackward);
  if (hs > 0) {
    std::vector<float> shared_dact(at(tokens * hs));
    std::vector<float> shared_dgu(at(tokens * 2 * hs));
    swiglu_mlp_backward({tokens, d, hs}, dy, x, w.shared_gate_up, w.shared_down,
                        cache.shared_gu.data(), cache.shared_act.data(), dx, dw.shared_gate_up,
                        dw.shared_down, shared_dact.data(), shared_dgu.data(), true);
  }

  timer.switch_to(Phase::kRouterBackward);
  router_backward(cache.router_shape, x, w.router, cache.router,
                  {d_weight.data(), lb_score_grad, lb_uses_softmax, z_grad_scale}, dx, dw.router);
}

void MoeBlock::experts_backward_sync(const MoeWeights& w, const MoeWeights& dw,
                                     const MoeCache& cache, const std::vector<float>& dy_send,
                                     std::vector<float>& dx_send) const {
  const int64_t d = config_.hidden_size;
  const int64_t local = shard_.count;
  if (exchange_->ranks() == 1) {
    // Send order is expert order (experts_forward_single_rank): the experts' backward reads the
    // output gradients and writes the input gradients in place.
    ScopedPhase timer(Phase::kExpertsBackward);
    grouped_experts_backward(config_, local, w, dw, cache, dy_send.data(), dx_send.data());
    return;
  }
  const int64_t received = cache.expert_offsets[at(local)];
  // Output gradients travel to the experts along the forward path, expert-major there.
  ScopedPhase timer(Phase::kDispatchBackward);
  std::vector<float> dy_recv(at(received * d)), dy_perm(at(received * d));
  exchange_->exchange_rows(dy_send.data(), cache.send_rows, dy_recv.data(), cache.recv_rows, d);
  const ConstTensorView to_expert = view(cache.recv_to_expert.data(), {received});
  kernels::permute_rows(view(dy_recv.data(), {received, d}), to_expert, 1,
                        view(dy_perm.data(), {received, d}));

  std::vector<float> dx_perm(at(received * d));
  timer.switch_to(Phase::kExpertsBackward);
  grouped_experts_backward(config_, local, w, dw, cache, dy_perm.data(), dx_perm.data());
  timer.switch_to(Phase::kCombineBackward);

  // Input gradients back to the source; dx[t] = sum over its routes.
  std::vector<float> dx_recv(at(received * d));
  kernels::gather_rows(view(dx_perm.data(), {received, d}), to_expert,
                       view(dx_recv.data(), {received, d}));
  exchange_->exchange_rows(dx_recv.data(), cache.recv_rows, dx_send.data(), cache.send_rows, d);
}

void MoeBlock::experts_backward_rowwise(const MoeWeights& w, const MoeWeights& dw,
                                        const MoeCache& cache, const std::vector<float>& dy_send,
                                        std::vector<float>& dx_send) const {
  const int64_t d = config_.hidden_size;
  const int64_t local = shard_.count;
  // Output gradients go to the rows their routes used in the forward; the experts' backward runs
  // in place (dy from the input buffer, dx into the output buffer), and each kept route fetches
  // its input gradient back. Dropped routes get none.
  ScopedPhase timer(Phase::kDispatchBackward);
  rowwise_->put_rows(dy_send.data(), 1, cache.targets, d);
  const float* dy_in = rowwise_->input();
  float* dx_out = rowwise_->output();
  timer.switch_to(Phase::kExpertsBackward);
  grouped_experts_backward(config_, local, w, dw, cache, dy_in, dx_out);
  timer.switch_to(Phase::kCombineBackward);
  std::fill(dx_send.begin(), dx_send.end(), 0.0f);
  rowwise_->get_rows(dx_send.data(), cache.targets, d);
}

}  // namespace moecore
