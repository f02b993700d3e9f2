#include "model/moe_block.h"

#include <algorithm>

#include "core/check.h"
#include "model/swiglu_mlp.h"

namespace moecore {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace

MoeBlock::MoeBlock(const ModelConfig& config, ExpertShard shard, const ExpertExchange* exchange)
    : config_(config), shard_(shard), exchange_(exchange != nullptr ? exchange : &local_) {
  MOE_CHECK(shard_.count * exchange_->ranks() == config.num_experts &&
                shard_.first == exchange_->rank() * shard_.count,
            "[moe] {} ranks holding {} experts each (from {}) do not cover num_experts={}",
            exchange_->ranks(), shard_.count, shard_.first, config.num_experts);
}

void MoeBlock::forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
                       MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, e_count = c.num_experts;
  const int64_t h = c.moe_intermediate_size, routes = tokens * k;
  const int64_t ranks = exchange_->ranks(), local = shard_.count;
  cache.router_shape = {tokens, d, e_count, k, c.router_score, c.norm_topk_prob};
  router_forward(cache.router_shape, x, w.router, cache.router);

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
  std::vector<float> x_send(at(routes * d));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < routes; ++r)
    std::copy_n(x + (r / k) * d, d, x_send.data() + cache.send_pos[at(r)] * d);

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
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < received; ++i)
    std::copy_n(x_recv.data() + i * d, d, cache.x_perm.data() + cache.recv_to_expert[at(i)] * d);

  // The grouped GEMM: one SwiGLU MLP per local expert over its contiguous rows.
  for (int64_t le = 0; le < local; ++le) {
    const int64_t begin = cache.expert_offsets[at(le)];
    const int64_t rows = cache.expert_offsets[at(le + 1)] - begin;
    if (rows == 0) continue;
    swiglu_mlp_forward({rows, d, h}, cache.x_perm.data() + begin * d,
                       w.experts_gate_up + le * 2 * h * d, w.experts_down + le * d * h,
                       cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                       cache.y_perm.data() + begin * d);
  }

  // Outputs back to their sources, in send order.
  std::vector<float> y_recv(at(received * d));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < received; ++i)
    std::copy_n(cache.y_perm.data() + cache.recv_to_expert[at(i)] * d, d, y_recv.data() + i * d);
  cache.y_back.resize(at(routes * d));
  exchange_->exchange_rows(y_recv.data(), cache.recv_rows, cache.y_back.data(), cache.send_rows, d);

  const int64_t hs = c.shared_expert_intermediate_size;
  if (hs > 0) {
    cache.shared_gu.resize(at(tokens * 2 * hs));
    cache.shared_act.resize(at(tokens * hs));
    swiglu_mlp_forward({tokens, d, hs}, x, w.shared_gate_up, w.shared_down, cache.shared_gu.data(),
                       cache.shared_act.data(), y);
  } else {
    std::fill(y, y + tokens * d, 0.0f);
  }
  // Combine: y[t] += sum_j weight[t, j] * output of route (t, j).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* yt = y + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const float weight = cache.router.topk_weight[at(t * k + j)];
      const float* src = cache.y_back.data() + cache.send_pos[at(t * k + j)] * d;
      for (int64_t i = 0; i < d; ++i) yt[i] += weight * src[i];
    }
  }
}

void MoeBlock::backward(const MoeWeights& w, const MoeWeights& dw, const float* x, const float* dy,
                        const MoeCache& cache, const float* lb_score_grad, bool lb_uses_softmax,
                        float z_grad_scale, float* dx) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, h = c.moe_intermediate_size;
  const int64_t tokens = cache.router_shape.tokens, routes = tokens * k;
  const int64_t local = shard_.count;
  const int64_t received = cache.expert_offsets[at(local)];

  // Combine backward at the source: d output(t, j) = weight * dy[t]; d weight = <dy[t], output>.
  std::vector<float> dy_send(at(routes * d));
  std::vector<float> d_weight(at(routes));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* dyt = dy + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const size_t r = at(t * k + j);
      const int64_t pos = cache.send_pos[r];
      const float weight = cache.router.topk_weight[r];
      const float* out = cache.y_back.data() + pos * d;
      float* g = dy_send.data() + pos * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        g[i] = weight * dyt[i];
        dot += dyt[i] * out[i];
      }
      d_weight[r] = dot;
    }
  }

  // Output gradients travel to the experts along the forward path, expert-major there.
  std::vector<float> dy_recv(at(received * d)), dy_perm(at(received * d));
  exchange_->exchange_rows(dy_send.data(), cache.send_rows, dy_recv.data(), cache.recv_rows, d);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < received; ++i)
    std::copy_n(dy_recv.data() + i * d, d, dy_perm.data() + cache.recv_to_expert[at(i)] * d);

  std::vector<float> dx_perm(at(received * d));
  std::vector<float> scratch_dact(at(received * h));
  std::vector<float> scratch_dgu(at(received * 2 * h));
  for (int64_t le = 0; le < local; ++le) {
    const int64_t begin = cache.expert_offsets[at(le)];
    const int64_t rows = cache.expert_offsets[at(le + 1)] - begin;
    if (rows == 0) continue;
    swiglu_mlp_backward({rows, d, h}, dy_perm.data() + begin * d, cache.x_perm.data() + begin * d,
                        w.experts_gate_up + le * 2 * h * d, w.experts_down + le * d * h,
                        cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                        dx_perm.data() + begin * d, dw.experts_gate_up + le * 2 * h * d,
                        dw.experts_down + le * d * h, scratch_dact.data() + begin * h,
                        scratch_dgu.data() + begin * 2 * h, false);
  }

  // Input gradients back to the source; dx[t] = sum over its routes.
  std::vector<float> dx_recv(at(received * d)), dx_send(at(routes * d));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < received; ++i)
    std::copy_n(dx_perm.data() + cache.recv_to_expert[at(i)] * d, d, dx_recv.data() + i * d);
  exchange_->exchange_rows(dx_recv.data(), cache.recv_rows, dx_send.data(), cache.send_rows, d);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* dxt = dx + t * d;
    std::fill(dxt, dxt + d, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = dx_send.data() + cache.send_pos[at(t * k + j)] * d;
      for (int64_t i = 0; i < d; ++i) dxt[i] += src[i];
    }
  }

  const int64_t hs = c.shared_expert_intermediate_size;
  if (hs > 0) {
    std::vector<float> shared_dact(at(tokens * hs));
    std::vector<float> shared_dgu(at(tokens * 2 * hs));
    swiglu_mlp_backward({tokens, d, hs}, dy, x, w.shared_gate_up, w.shared_down,
                        cache.shared_gu.data(), cache.shared_act.data(), dx, dw.shared_gate_up,
                        dw.shared_down, shared_dact.data(), shared_dgu.data(), true);
  }

  router_backward(cache.router_shape, x, w.router, cache.router,
                  {d_weight.data(), lb_score_grad, lb_uses_softmax, z_grad_scale}, dx, dw.router);
}

}  // namespace moecore
