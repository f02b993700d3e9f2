// The router's scores, top-k choice and routing weights on the CPU: tokens over the OpenMP pool,
// each token's arithmetic in a fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/splitmix64.h"
#include "kernels/cpu/ops.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::cpu {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// Row softmax in fp32 with max subtraction; returns the log-sum-exp.
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

void router_topk_forward(ConstTensorView logits, ConstTensorView selection_bias,
                         const RouterTopkOptions& o, TensorView scores, TensorView topk_index,
                         TensorView topk_weight, TensorView expert_counts) {
  constexpr const char* kOp = "router_topk";
  const RouterDims s = router_dims(kOp, logits, o);
  const int64_t n = s.tokens, e_count = s.experts, k = o.top_k;
  expect_router_outputs(kOp, s, k, scores, topk_index, topk_weight, expert_counts);
  int64_t* counts = expert_counts.data<int64_t>(kOp);
  const float* bias = nullptr;
  if (selection_bias.raw() != nullptr) {
    expect_shape(kOp, "selection_bias", selection_bias, {e_count});
    bias = selection_bias.data<float>(kOp);
  }
  const float* zp = logits.data<float>(kOp);
  float* pp = scores.data<float>(kOp);
  int32_t* index = topk_index.data<int32_t>(kOp);
  float* weight = topk_weight.data<float>(kOp);

  const bool topk_softmax = o.score == RouterScoreFunction::kTopkSoftmax;
  const bool grouped = o.n_group > 1;
  const int64_t group_size = e_count / o.n_group;
#pragma omp parallel
  {
    std::vector<int32_t> order(at(e_count));
    std::vector<uint64_t> draw(o.choice == RouterChoice::kRandom ? at(e_count) : 0);
    // Selection scores (scores + bias) and the group ranking, only when they differ from scores.
    std::vector<float> choice(bias != nullptr || grouped ? at(e_count) : 0);
    std::vector<float> group_score(grouped ? at(o.n_group) : 0);
    std::vector<int32_t> group_order(group_score.size());
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* z = zp + t * e_count;
      float* p = pp + t * e_count;
      if (o.score == RouterScoreFunction::kSigmoid) {
        for (int64_t e = 0; e < e_count; ++e)
          p[e] = 1.0f / (1.0f + std::exp(-z[e])) + kSigmoidScoreEpsilon;
      } else {
        softmax_row(z, p, e_count);
      }
      const int64_t global_t = o.token_offset + t;
      int64_t candidates = e_count;  // order[0, candidates) compete for the k slots
      if (o.choice == RouterChoice::kBalanced) {
        for (int64_t j = 0; j < k; ++j)
          order[at(j)] = static_cast<int32_t>((global_t * k + j) % e_count);
      } else {
        for (int64_t e = 0; e < e_count; ++e) order[at(e)] = static_cast<int32_t>(e);
        if (o.choice == RouterChoice::kRandom) {
          SplitMix64 rng(mix64(o.seed ^ mix64(static_cast<uint64_t>(global_t))));
          for (int64_t e = 0; e < e_count; ++e) draw[at(e)] = rng.next();
          const uint64_t* r = draw.data();
          std::partial_sort(
              order.begin(), order.begin() + k, order.end(),
              [r](int32_t a, int32_t b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
        } else {
          // Selection keys: the scores, or with topk_softmax the logits (OLMo-core ranks its
          // logits there), plus the selection bias.
          const float* q = topk_softmax ? z : p;
          if (!choice.empty()) {
            for (int64_t e = 0; e < e_count; ++e)
              choice[at(e)] = q[e] + (bias != nullptr ? bias[e] : 0.0f);
            q = choice.data();
          }
          if (grouped) {
            // Group score: the sum of the group's two best selection scores (DeepSeek-V3).
            for (int64_t g = 0; g < o.n_group; ++g) {
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
              group_score[at(g)] = group_size > 1 ? best + second : best;
              group_order[at(g)] = static_cast<int32_t>(g);
            }
            const float* gs = group_score.data();
            std::partial_sort(
                group_order.begin(), group_order.begin() + o.topk_group, group_order.end(),
                [gs](int32_t a, int32_t b) { return gs[a] > gs[b] || (gs[a] == gs[b] && a < b); });
            // The kept groups' experts, in ascending expert index (the tie rule needs no more).
            std::sort(group_order.begin(), group_order.begin() + o.topk_group);
            candidates = 0;
            for (int64_t i = 0; i < o.topk_group; ++i)
              for (int64_t e = 0; e < group_size; ++e)
                order[at(candidates++)] = static_cast<int32_t>(group_order[at(i)] * group_size + e);
          }
          // Highest selection score first; equal scores: lower expert index first.
          std::partial_sort(
              order.begin(), order.begin() + k, order.begin() + candidates,
              [q](int32_t a, int32_t b) { return q[a] > q[b] || (q[a] == q[b] && a < b); });
        }
      }
      int32_t* idx = index + t * k;
      float* wt = weight + t * k;
      for (int64_t j = 0; j < k; ++j) idx[j] = order[at(j)];
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
        if (o.norm_topk_prob)
          for (int64_t j = 0; j < k; ++j) wt[j] /= sum;
      }
      if (o.routed_scaling_factor != 1.0f)
        for (int64_t j = 0; j < k; ++j) wt[j] *= o.routed_scaling_factor;
    }
  }
  std::fill_n(counts, e_count, 0);
  for (int64_t r = 0; r < n * k; ++r) ++counts[at(index[r])];
}

void router_topk_backward(ConstTensorView logits, ConstTensorView scores,
                          ConstTensorView topk_index, ConstTensorView topk_weight,
                          ConstTensorView d_weight, const RouterLossGrads& g,
                          const RouterTopkOptions& o, TensorView dlogits) {
  constexpr const char* kOp = "router_topk_backward";
  const RouterDims s = router_dims(kOp, logits, o);
  const int64_t n = s.tokens, e_count = s.experts, k = o.top_k;
  expect_shape(kOp, "scores", scores, {n, e_count});
  expect_shape(kOp, "topk_index", topk_index, {n, k});
  expect_shape(kOp, "topk_weight", topk_weight, {n, k});
  expect_shape(kOp, "d_weight", d_weight, {n, k});
  expect_shape(kOp, "dlogits", dlogits, {n, e_count});
  // Token t reads row t / (N / G) of the load-balancing gradient (one row: every token).
  const float* lb_rows = nullptr;
  int64_t group_tokens = n;
  if (g.lb_score_grad.raw() != nullptr) {
    group_tokens = n / token_groups(kOp, "lb_score_grad", g.lb_score_grad, n, e_count);
    lb_rows = g.lb_score_grad.data<float>(kOp);
  }
  const float* zp = logits.data<float>(kOp);
  const float* pp = scores.data<float>(kOp);
  const int32_t* index = topk_index.data<int32_t>(kOp);
  const float* weight = topk_weight.data<float>(kOp);
  const float* dweight = d_weight.data<float>(kOp);
  float* dzp = dlogits.data<float>(kOp);
  const bool softmax_scores = o.score != RouterScoreFunction::kSigmoid;
  const bool renormalised = o.norm_topk_prob || o.score == RouterScoreFunction::kTopkSoftmax;
#pragma omp parallel
  {
    std::vector<float> dscore(at(e_count));
    std::vector<float> soft(at(e_count));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* lb = lb_rows != nullptr ? lb_rows + t / group_tokens * e_count : nullptr;
      const float* z = zp + t * e_count;
      const float* p = pp + t * e_count;
      const int32_t* idx = index + t * k;
      const float* wt = weight + t * k;
      const float* dwt = dweight + t * k;
      float* dz = dzp + t * e_count;
      std::fill(dscore.begin(), dscore.end(), 0.0f);
      // Routing weights -> selected scores. With renormalisation (or topk_softmax, which is the
      // renormalised softmax in exact arithmetic) w_j = f s_j / S, f = routed_scaling_factor:
      // dL/ds_j = (f dw_j - sum_i dw_i w_i) / S. Without it w_j = f s_j.
      const float f = o.routed_scaling_factor;
      if (renormalised) {
        float sum_sel = 0.0f, dot = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          sum_sel += p[idx[j]];
          dot += dwt[j] * wt[j];
        }
        for (int64_t j = 0; j < k; ++j) dscore[at(idx[j])] += (f * dwt[j] - dot) / sum_sel;
      } else {
        for (int64_t j = 0; j < k; ++j) dscore[at(idx[j])] += f * dwt[j];
      }
      const bool need_softmax = !softmax_scores && (g.lb_uses_softmax || g.z_grad_scale != 0.0f);
      float lse = 0.0f;
      if (need_softmax || (softmax_scores && g.z_grad_scale != 0.0f))
        lse = softmax_row(z, soft.data(), e_count);
      if (softmax_scores) {
        if (lb != nullptr)
          for (int64_t e = 0; e < e_count; ++e) dscore[at(e)] += lb[e];
        float dot = 0.0f;
        for (int64_t e = 0; e < e_count; ++e) dot += dscore[at(e)] * p[e];
        for (int64_t e = 0; e < e_count; ++e) dz[e] = p[e] * (dscore[at(e)] - dot);
      } else {
        if (lb != nullptr && !g.lb_uses_softmax) {
          // OLMo-core's probabilities q_e = s_e / S_all: dL/ds_e = (g_e - sum_i g_i q_i) / S_all.
          float sum_all = 0.0f;
          for (int64_t e = 0; e < e_count; ++e) sum_all += p[e];
          float dot = 0.0f;
          for (int64_t e = 0; e < e_count; ++e) dot += lb[e] * (p[e] / sum_all);
          for (int64_t e = 0; e < e_count; ++e) dscore[at(e)] += (lb[e] - dot) / sum_all;
        }
        // The scores hold sigmoid + epsilon; the Jacobian is the sigmoid's own, from the logit.
        for (int64_t e = 0; e < e_count; ++e) {
          const float sig = 1.0f / (1.0f + std::exp(-z[e]));
          dz[e] = dscore[at(e)] * sig * (1.0f - sig);
        }
        if (lb != nullptr && g.lb_uses_softmax) {
          float dot = 0.0f;
          for (int64_t e = 0; e < e_count; ++e) dot += lb[e] * soft[at(e)];
          for (int64_t e = 0; e < e_count; ++e) dz[e] += soft[at(e)] * (lb[e] - dot);
        }
      }
      // z-loss: d(lse^2)/dz_e = 2 * lse * softmax_e.
      if (g.z_grad_scale != 0.0f) {
        const float* q = softmax_scores ? p : soft.data();
        for (int64_t e = 0; e < e_count; ++e) dz[e] += g.z_grad_scale * 2.0f * lse * q[e];
      }
    }
  }
}

void router_z_loss(ConstTensorView logits, TensorView z_loss) {
  constexpr const char* kOp = "router_z_loss";
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [N, E], got rank {}", kOp, logits.rank());
  const int64_t n = logits.size(0), e_count = logits.size(1);
  expect_shape(kOp, "logits", logits, {n, e_count});
  expect_shape(kOp, "z_loss", z_loss, {1});
  double* out = z_loss.data<double>(kOp);
  *out = 0.0;
  if (n == 0) return;
  const float* zp = logits.data<float>(kOp);
  double total = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const float* z = zp + t * e_count;
    const float max_z = *std::max_element(z, z + e_count);
    double sum = 0.0;
    for (int64_t e = 0; e < e_count; ++e) sum += std::exp(static_cast<double>(z[e] - max_z));
    const double lse = static_cast<double>(max_z) + std::log(sum);
    total += lse * lse;
  }
  *out = total / static_cast<double>(n);
}

void router_probability_column_sums(ConstTensorView logits, ConstTensorView scores,
                                    RouterProbability probability, TensorView column_sums_view) {
  constexpr const char* kOp = "router_probability_column_sums";
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [N, E], got rank {}", kOp, logits.rank());
  const int64_t n = logits.size(0), e_count = logits.size(1);
  expect_shape(kOp, "logits", logits, {n, e_count});
  expect_shape(kOp, "scores", scores, {n, e_count});
  const int64_t groups = token_groups(kOp, "column_sums", column_sums_view, n, e_count);
  const std::span<double> all_sums(column_sums_view.data<double>(kOp), at(groups * e_count));
  const float* zp = logits.data<float>(kOp);
  const float* pp = scores.data<float>(kOp);
  std::fill(all_sums.begin(), all_sums.end(), 0.0);
  std::vector<float> soft(at(e_count));
  for (int64_t t = 0; t < n; ++t) {
    const std::span<double> column_sums = all_sums.subspan(at(t / (n / groups) * e_count));
    const float* p = pp + t * e_count;
    switch (probability) {
      case RouterProbability::kScores:
        for (int64_t e = 0; e < e_count; ++e) column_sums[at(e)] += static_cast<double>(p[e]);
        break;
      case RouterProbability::kSoftmaxOfLogits:
        softmax_row(zp + t * e_count, soft.data(), e_count);
        for (int64_t e = 0; e < e_count; ++e)
          column_sums[at(e)] += static_cast<double>(soft[at(e)]);
        break;
      case RouterProbability::kScoresOverRowSum: {
        // The same fp32 sum and quotient as router_topk_backward's.
        float sum_all = 0.0f;
        for (int64_t e = 0; e < e_count; ++e) sum_all += p[e];
        for (int64_t e = 0; e < e_count; ++e)
          column_sums[at(e)] += static_cast<double>(p[e] / sum_all);
        break;
      }
    }
  }
}

void route_counts_by_group(ConstTensorView topk_index, TensorView counts_view) {
  constexpr const char* kOp = "route_counts_by_group";
  const GroupCountDims d = group_count_dims(kOp, topk_index, counts_view);
  const int64_t routes = d.tokens * d.top_k;
  const int32_t* index = topk_index.data<int32_t>(kOp);
  expect_expert_ids(kOp, index, routes, d.experts);
  int64_t* counts = counts_view.data<int64_t>(kOp);
  std::fill_n(counts, d.groups * d.experts, int64_t{0});
  const int64_t group_routes = routes / d.groups;  // a group: N / G tokens, k routes each
  for (int64_t r = 0; r < routes; ++r) ++counts[r / group_routes * d.experts + index[r]];
}

}  // namespace moecore::kernels::cpu
