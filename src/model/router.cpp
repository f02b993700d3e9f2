#include "model/router.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/linear.h"

namespace moecore {

namespace {

// Row softmax of logits in fp32 with max subtraction; returns log-sum-exp.
float softmax_row(const float* z, float* p, int64_t n) {
  const float max_z = *std::max_element(z, z + n);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(z[j] - max_z);
    sum += p[j];
  }
  for (int64_t j = 0; j < n; ++j) p[j] /= sum;
  return max_z + std::log(sum);
}

}  // namespace

void router_forward(const RouterShape& s, const float* x, const float* w_router, RouterState& st) {
  const int64_t n = s.tokens, e_count = s.num_experts, k = s.top_k;
  st.logits.resize(static_cast<size_t>(n * e_count));
  st.scores.resize(st.logits.size());
  st.topk_index.resize(static_cast<size_t>(n * k));
  st.topk_weight.resize(st.topk_index.size());
  // fp32 whatever the matmul precision: bf16 rounding of the logits would flip near-tied routes.
  linear_forward_fp32(x, w_router, st.logits.data(), n, s.dim, e_count);
  const RouterSelection sel = st.selection;
  MOE_CHECK(sel.mode == Routing::kLearned || sel.token_offset >= 0,
            "[router] routing token offset {} must be >= 0", sel.token_offset);

  const bool topk_softmax = s.score == RouterScore::kTopkSoftmax;
  const bool grouped = s.n_group > 1;
  const int64_t group_size = e_count / s.n_group;
#pragma omp parallel
  {
    std::vector<int32_t> order(static_cast<size_t>(e_count));
    std::vector<uint64_t> draw(sel.mode == Routing::kRandom ? static_cast<size_t>(e_count) : 0);
    // Selection scores (scores + bias) and the group ranking, only when they differ from scores.
    std::vector<float> choice(sel.bias != nullptr || grouped ? static_cast<size_t>(e_count) : 0);
    std::vector<float> group_score(grouped ? static_cast<size_t>(s.n_group) : 0);
    std::vector<int32_t> group_order(group_score.size());
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* z = st.logits.data() + t * e_count;
      float* p = st.scores.data() + t * e_count;
      if (s.score == RouterScore::kSigmoid) {
        for (int64_t e = 0; e < e_count; ++e) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
      } else {
        softmax_row(z, p, e_count);
      }
      const int64_t global_t = sel.token_offset + t;
      int64_t candidates = e_count;  // order[0, candidates) compete for the k slots
      if (sel.mode == Routing::kBalanced) {
        for (int64_t j = 0; j < k; ++j)
          order[static_cast<size_t>(j)] = static_cast<int32_t>((global_t * k + j) % e_count);
      } else {
        for (int64_t e = 0; e < e_count; ++e)
          order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        if (sel.mode == Routing::kRandom) {
          SplitMix64 rng(mix64(sel.seed ^ mix64(static_cast<uint64_t>(global_t))));
          for (int64_t e = 0; e < e_count; ++e) draw[static_cast<size_t>(e)] = rng.next();
          const uint64_t* r = draw.data();
          std::partial_sort(
              order.begin(), order.begin() + k, order.end(),
              [r](int32_t a, int32_t b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
        } else {
          const float* q = p;
          if (!choice.empty()) {
            for (int64_t e = 0; e < e_count; ++e)
              choice[static_cast<size_t>(e)] = p[e] + (sel.bias != nullptr ? sel.bias[e] : 0.0f);
            q = choice.data();
          }
          if (grouped) {
            // Group score: the sum of the group's two best selection scores (DeepSeek-V3).
            for (int64_t g = 0; g < s.n_group; ++g) {
              const float* qg = q + g * group_size;
              float best = qg[0], second = -INFINITY;
              for (int64_t i = 1; i < group_size; ++i) {
                if (qg[i] > best) {
                  second = best;
                  best = qg[i];
                } else if (qg[i] > second) {
                  second = qg[i];
                }
              }
              group_score[static_cast<size_t>(g)] = group_size > 1 ? best + second : best;
              group_order[static_cast<size_t>(g)] = static_cast<int32_t>(g);
            }
            const float* gs = group_score.data();
            std::partial_sort(
                group_order.begin(), group_order.begin() + s.topk_group, group_order.end(),
                [gs](int32_t a, int32_t b) { return gs[a] > gs[b] || (gs[a] == gs[b] && a < b); });
            // The kept groups' experts, in ascending expert index (the tie rule needs no more).
            std::sort(group_order.begin(), group_order.begin() + s.topk_group);
            candidates = 0;
            for (int64_t i = 0; i < s.topk_group; ++i)
              for (int64_t e = 0; e < group_size; ++e)
                order[static_cast<size_t>(candidates++)] =
                    static_cast<int32_t>(group_order[static_cast<size_t>(i)] * group_size + e);
          }
          // Highest selection score first; equal scores: lower expert index first.
          std::partial_sort(
              order.begin(), order.begin() + k, order.begin() + candidates,
              [q](int32_t a, int32_t b) { return q[a] > q[b] || (q[a] == q[b] && a < b); });
        }
      }
      int32_t* idx = st.topk_index.data() + t * k;
      float* wt = st.topk_weight.data() + t * k;
      for (int64_t j = 0; j < k; ++j) idx[j] = order[static_cast<size_t>(j)];
      if (topk_softmax) {
        // Softmax over the selected logits, with max subtraction.
        float max_z = z[idx[0]];
        for (int64_t j = 1; j < k; ++j) max_z = std::max(max_z, z[idx[j]]);
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          wt[j] = std::exp(z[idx[j]] - max_z);
          sum += wt[j];
        }
        for (int64_t j = 0; j < k; ++j) wt[j] /= sum;
      } else {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          wt[j] = p[idx[j]];
          sum += wt[j];
        }
        if (s.norm_topk_prob)
          for (int64_t j = 0; j < k; ++j) wt[j] /= sum;
      }
      if (s.routed_scaling_factor != 1.0f)
        for (int64_t j = 0; j < k; ++j) wt[j] *= s.routed_scaling_factor;
    }
  }
  st.expert_counts.assign(static_cast<size_t>(e_count), 0);
  for (int32_t e : st.topk_index) ++st.expert_counts[static_cast<size_t>(e)];
}

void router_backward(const RouterShape& s, const float* x, const float* w_router,
                     const RouterState& st, const RouterGrads& g, float* dx, float* dw_router) {
  const int64_t n = s.tokens, e_count = s.num_experts, k = s.top_k;
  std::vector<float> dlogits(static_cast<size_t>(n * e_count));
  const bool softmax_scores = s.score != RouterScore::kSigmoid;
  const bool renormalised = s.norm_topk_prob || s.score == RouterScore::kTopkSoftmax;
#pragma omp parallel
  {
    std::vector<float> dscore(static_cast<size_t>(e_count));
    std::vector<float> soft(static_cast<size_t>(e_count));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* z = st.logits.data() + t * e_count;
      const float* p = st.scores.data() + t * e_count;
      const int32_t* idx = st.topk_index.data() + t * k;
      const float* wt = st.topk_weight.data() + t * k;
      const float* dwt = g.d_weight + t * k;
      float* dz = dlogits.data() + t * e_count;
      std::fill(dscore.begin(), dscore.end(), 0.0f);
      // Routing weights -> selected scores. With renormalisation (or topk_softmax, which is the
      // renormalised softmax in exact arithmetic) w_j = f s_j / S, f = routed_scaling_factor:
      // dL/ds_j = (f dw_j - sum_i dw_i w_i) / S. Without it w_j = f s_j.
      const float f = s.routed_scaling_factor;
      if (renormalised) {
        float sum_sel = 0.0f, dot = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          sum_sel += p[idx[j]];
          dot += dwt[j] * wt[j];
        }
        for (int64_t j = 0; j < k; ++j)
          dscore[static_cast<size_t>(idx[j])] += (f * dwt[j] - dot) / sum_sel;
      } else {
        for (int64_t j = 0; j < k; ++j) dscore[static_cast<size_t>(idx[j])] += f * dwt[j];
      }
      const bool need_softmax = !softmax_scores && (g.lb_uses_softmax || g.z_grad_scale != 0.0f);
      float lse = 0.0f;
      if (need_softmax || (softmax_scores && g.z_grad_scale != 0.0f))
        lse = softmax_row(z, soft.data(), e_count);
      if (softmax_scores) {
        if (g.lb_score_grad != nullptr)
          for (int64_t e = 0; e < e_count; ++e)
            dscore[static_cast<size_t>(e)] += g.lb_score_grad[e];
        float dot = 0.0f;
        for (int64_t e = 0; e < e_count; ++e) dot += dscore[static_cast<size_t>(e)] * p[e];
        for (int64_t e = 0; e < e_count; ++e) dz[e] = p[e] * (dscore[static_cast<size_t>(e)] - dot);
      } else {
        if (g.lb_score_grad != nullptr && !g.lb_uses_softmax) {
          // OLMo-core's probabilities q_e = s_e / S_all: dL/ds_e = (g_e - sum_i g_i q_i) / S_all.
          float sum_all = 0.0f;
          for (int64_t e = 0; e < e_count; ++e) sum_all += p[e];
          float dot = 0.0f;
          for (int64_t e = 0; e < e_count; ++e) dot += g.lb_score_grad[e] * (p[e] / sum_all);
          for (int64_t e = 0; e < e_count; ++e)
            dscore[static_cast<size_t>(e)] += (g.lb_score_grad[e] - dot) / sum_all;
        }
        for (int64_t e = 0; e < e_count; ++e)
          dz[e] = dscore[static_cast<size_t>(e)] * p[e] * (1.0f - p[e]);
        if (g.lb_score_grad != nullptr && g.lb_uses_softmax) {
          float dot = 0.0f;
          for (int64_t e = 0; e < e_count; ++e)
            dot += g.lb_score_grad[e] * soft[static_cast<size_t>(e)];
          for (int64_t e = 0; e < e_count; ++e)
            dz[e] += soft[static_cast<size_t>(e)] * (g.lb_score_grad[e] - dot);
        }
      }
      // z-loss: d(lse^2)/dz_e = 2 * lse * softmax_e.
      if (g.z_grad_scale != 0.0f) {
        const float* q = softmax_scores ? p : soft.data();
        for (int64_t e = 0; e < e_count; ++e) dz[e] += g.z_grad_scale * 2.0f * lse * q[e];
      }
    }
  }
  linear_backward_fp32(dlogits.data(), x, w_router, dx, dw_router, n, s.dim, e_count, true);
}

double router_z_loss(const RouterShape& s, const RouterState& st) {
  if (s.tokens == 0) return 0.0;
  double total = 0.0;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* z = st.logits.data() + t * s.num_experts;
    const float max_z = *std::max_element(z, z + s.num_experts);
    double sum = 0.0;
    for (int64_t e = 0; e < s.num_experts; ++e) sum += std::exp(static_cast<double>(z[e] - max_z));
    const double lse = static_cast<double>(max_z) + std::log(sum);
    total += lse * lse;
  }
  return total / static_cast<double>(s.tokens);
}

std::vector<double> router_softmax_column_sums(const RouterShape& s, const RouterState& st) {
  if (s.score != RouterScore::kSigmoid) return router_score_column_sums(s, st);
  std::vector<double> sums(static_cast<size_t>(s.num_experts), 0.0);
  std::vector<float> p(static_cast<size_t>(s.num_experts));
  for (int64_t t = 0; t < s.tokens; ++t) {
    softmax_row(st.logits.data() + t * s.num_experts, p.data(), s.num_experts);
    for (int64_t e = 0; e < s.num_experts; ++e)
      sums[static_cast<size_t>(e)] += static_cast<double>(p[static_cast<size_t>(e)]);
  }
  return sums;
}

std::vector<double> router_score_column_sums(const RouterShape& s, const RouterState& st) {
  std::vector<double> sums(static_cast<size_t>(s.num_experts), 0.0);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t e = 0; e < s.num_experts; ++e)
      sums[static_cast<size_t>(e)] +=
          static_cast<double>(st.scores[static_cast<size_t>(t * s.num_experts + e)]);
  return sums;
}

}  // namespace moecore

namespace moecore {

std::vector<double> router_lb_column_sums(const RouterShape& s, const RouterState& st) {
  if (s.score != RouterScore::kSigmoid) return router_score_column_sums(s, st);
  std::vector<double> sums(static_cast<size_t>(s.num_experts), 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* p = st.scores.data() + t * s.num_experts;
    // The same fp32 sum and quotient as router_backward's.
    float sum_all = 0.0f;
    for (int64_t e = 0; e < s.num_experts; ++e) sum_all += p[e];
    for (int64_t e = 0; e < s.num_experts; ++e)
      sums[static_cast<size_t>(e)] += static_cast<double>(p[e] / sum_all);
  }
  return sums;
}

}  // namespace moecore
