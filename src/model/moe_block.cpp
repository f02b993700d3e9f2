#include "model/moe_block.h"

#include <algorithm>

#include "model/swiglu_mlp.h"

namespace moecore {

namespace {

// Runs one SwiGLU MLP per expert over its contiguous row range of the expert-major buffers: the
// grouped GEMM. Experts with no rows are skipped without touching their weights.
void grouped_experts_forward(const ModelConfig& c, const MoeWeights& w, MoeCache& cache) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const int64_t begin = cache.expert_offsets[static_cast<size_t>(e)];
    const int64_t rows = cache.expert_offsets[static_cast<size_t>(e + 1)] - begin;
    if (rows == 0) continue;
    swiglu_mlp_forward({rows, d, h}, cache.x_perm.data() + begin * d,
                       w.experts_gate_up + e * 2 * h * d, w.experts_down + e * d * h,
                       cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                       cache.y_perm.data() + begin * d);
  }
}

}  // namespace

void MoeBlock::forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
                       MoeCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, e_count = c.num_experts;
  const int64_t h = c.moe_intermediate_size, routes = tokens * k;
  cache.router_shape = {tokens, d, e_count, k, c.router_score, c.norm_topk_prob};
  router_forward(cache.router_shape, x, w.router, cache.router);

  // Expert-major placement: expert e owns rows [offsets[e], offsets[e+1]); inside an expert, routes
  // keep token order, which makes the layout deterministic.
  cache.expert_offsets.assign(static_cast<size_t>(e_count + 1), 0);
  for (int64_t e = 0; e < e_count; ++e)
    cache.expert_offsets[static_cast<size_t>(e + 1)] =
        cache.expert_offsets[static_cast<size_t>(e)] +
        cache.router.expert_counts[static_cast<size_t>(e)];
  std::vector<int64_t> cursor(cache.expert_offsets.begin(), cache.expert_offsets.end() - 1);
  cache.route_row.resize(static_cast<size_t>(routes));
  cache.row_token.resize(static_cast<size_t>(routes));
  for (int64_t r = 0; r < routes; ++r) {
    const int64_t row =
        cursor[static_cast<size_t>(cache.router.topk_index[static_cast<size_t>(r)])]++;
    cache.route_row[static_cast<size_t>(r)] = static_cast<int32_t>(row);
    cache.row_token[static_cast<size_t>(row)] = static_cast<int32_t>(r / k);
  }

  cache.x_perm.resize(static_cast<size_t>(routes * d));
  cache.gu_perm.resize(static_cast<size_t>(routes * 2 * h));
  cache.act_perm.resize(static_cast<size_t>(routes * h));
  cache.y_perm.resize(static_cast<size_t>(routes * d));
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < routes; ++row)
    std::copy_n(x + cache.row_token[static_cast<size_t>(row)] * d, d,
                cache.x_perm.data() + row * d);

  grouped_experts_forward(c, w, cache);

  const int64_t hs = c.shared_expert_intermediate_size;
  if (hs > 0) {
    cache.shared_gu.resize(static_cast<size_t>(tokens * 2 * hs));
    cache.shared_act.resize(static_cast<size_t>(tokens * hs));
    swiglu_mlp_forward({tokens, d, hs}, x, w.shared_gate_up, w.shared_down, cache.shared_gu.data(),
                       cache.shared_act.data(), y);
  } else {
    std::fill(y, y + tokens * d, 0.0f);
  }

  // Combine: y[t] += sum_j weight[t, j] * y_perm[row(t, j)].
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* yt = y + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const float weight = cache.router.topk_weight[static_cast<size_t>(t * k + j)];
      const float* src = cache.y_perm.data() + cache.route_row[static_cast<size_t>(t * k + j)] * d;
      for (int64_t i = 0; i < d; ++i) yt[i] += weight * src[i];
    }
  }
}

void MoeBlock::backward(const MoeWeights& w, const MoeWeights& dw, const float* x, const float* dy,
                        const MoeCache& cache, const float* lb_score_grad, bool lb_uses_softmax,
                        float z_grad_scale, float* dx) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok, e_count = c.num_experts;
  const int64_t h = c.moe_intermediate_size, tokens = cache.router_shape.tokens;
  const int64_t routes = tokens * k;

  // Combine backward: d y_perm[row(t,j)] = weight * dy[t]; d weight[t,j] = <dy[t], y_perm[row]>.
  std::vector<float> dy_perm(static_cast<size_t>(routes * d));
  std::vector<float> d_weight(static_cast<size_t>(routes));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* dyt = dy + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const size_t r = static_cast<size_t>(t * k + j);
      const int64_t row = cache.route_row[r];
      const float weight = cache.router.topk_weight[r];
      const float* yp = cache.y_perm.data() + row * d;
      float* dyp = dy_perm.data() + row * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        dyp[i] = weight * dyt[i];
        dot += dyt[i] * yp[i];
      }
      d_weight[r] = dot;
    }
  }

  // Grouped GEMM backward over the expert-major buffers.
  std::vector<float> dx_perm(static_cast<size_t>(routes * d));
  std::vector<float> scratch_dact(static_cast<size_t>(routes * h));
  std::vector<float> scratch_dgu(static_cast<size_t>(routes * 2 * h));
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t begin = cache.expert_offsets[static_cast<size_t>(e)];
    const int64_t rows = cache.expert_offsets[static_cast<size_t>(e + 1)] - begin;
    if (rows == 0) continue;
    swiglu_mlp_backward({rows, d, h}, dy_perm.data() + begin * d, cache.x_perm.data() + begin * d,
                        w.experts_gate_up + e * 2 * h * d, w.experts_down + e * d * h,
                        cache.gu_perm.data() + begin * 2 * h, cache.act_perm.data() + begin * h,
                        dx_perm.data() + begin * d, dw.experts_gate_up + e * 2 * h * d,
                        dw.experts_down + e * d * h, scratch_dact.data() + begin * h,
                        scratch_dgu.data() + begin * 2 * h, false);
  }

  // Un-permute: dx[t] = sum_j dx_perm[row(t, j)] (+ shared expert + router below).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* dxt = dx + t * d;
    std::fill(dxt, dxt + d, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = dx_perm.data() + cache.route_row[static_cast<size_t>(t * k + j)] * d;
      for (int64_t i = 0; i < d; ++i) dxt[i] += src[i];
    }
  }

  const int64_t hs = c.shared_expert_intermediate_size;
  if (hs > 0) {
    std::vector<float> shared_dact(static_cast<size_t>(tokens * hs));
    std::vector<float> shared_dgu(static_cast<size_t>(tokens * 2 * hs));
    swiglu_mlp_backward({tokens, d, hs}, dy, x, w.shared_gate_up, w.shared_down,
                        cache.shared_gu.data(), cache.shared_act.data(), dx, dw.shared_gate_up,
                        dw.shared_down, shared_dact.data(), shared_dgu.data(), true);
  }

  router_backward(cache.router_shape, x, w.router, cache.router,
                  {d_weight.data(), lb_score_grad, lb_uses_softmax, z_grad_scale}, dx, dw.router);
}

}  // namespace moecore
