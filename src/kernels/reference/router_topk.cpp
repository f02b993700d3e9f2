// The router, the plain-loop oracle: the top-k by a full stable sort, the group limit by ranking
// whole groups, and the backward through the explicit Jacobians of the scores and weights, in
// double.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "core/splitmix64.h"
#include "kernels/ops.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::reference {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// Softmax of one row in double.
std::vector<double> softmax(const float* z, int64_t n) {
  double max_z = z[0];
  for (int64_t e = 1; e < n; ++e) max_z = std::max(max_z, double{z[e]});
  std::vector<double> p(at(n));
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) sum += p[at(e)] = std::exp(double{z[e]} - max_z);
  for (double& v : p) v /= sum;
  return p;
}

// The experts in order of decreasing key, ties to the lower index.
template <typename Key>
std::vector<int32_t> ranked(const std::vector<Key>& key) {
  std::vector<int32_t> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key[at(a)] > key[at(b)]; });
  return order;
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
  const float* zp = logits.data<float>(kOp);
  const float* bias = selection_bias.raw() != nullptr ? selection_bias.data<float>(kOp) : nullptr;
  float* pp = scores.data<float>(kOp);
  int32_t* index = topk_index.data<int32_t>(kOp);
  float* weight = topk_weight.data<float>(kOp);
  std::fill_n(counts, e_count, 0);
  for (int64_t t = 0; t < n; ++t) {
    const float* z = zp + t * e_count;
    float* p = pp + t * e_count;
    // The scores in fp32 as the model stores them (the choice compares these very values).
    if (o.score == RouterScoreFunction::kSigmoid) {
      for (int64_t e = 0; e < e_count; ++e)
        p[e] = 1.0f / (1.0f + std::exp(-z[e])) + kSigmoidScoreEpsilon;
    } else {
      const std::vector<double> soft = softmax(z, e_count);
      for (int64_t e = 0; e < e_count; ++e) p[e] = static_cast<float>(soft[at(e)]);
    }
    const int64_t global_t = o.token_offset + t;
    std::vector<int32_t> chosen;
    if (o.choice == RouterChoice::kBalanced) {
      for (int64_t j = 0; j < k; ++j)
        chosen.push_back(static_cast<int32_t>((global_t * k + j) % e_count));
    } else if (o.choice == RouterChoice::kRandom) {
      SplitMix64 rng(mix64(o.seed ^ mix64(static_cast<uint64_t>(global_t))));
      std::vector<uint64_t> draw(at(e_count));
      for (auto& r : draw) r = rng.next();
      chosen = ranked(draw);
    } else {
      // Selection keys: the scores, or with topk_softmax the logits (OLMo-core ranks its logits
      // there), plus the selection bias.
      const float* key = o.score == RouterScoreFunction::kTopkSoftmax ? z : p;
      std::vector<float> q(at(e_count));
      for (int64_t e = 0; e < e_count; ++e) q[at(e)] = key[e] + (bias != nullptr ? bias[e] : 0.0f);
      if (o.n_group > 1) {
        // Rank the groups by the sum of their two best selection scores; experts outside the
        // topk_group best groups drop out of the race.
        const int64_t size = e_count / o.n_group;
        std::vector<float> group_score(at(o.n_group));
        for (int64_t g = 0; g < o.n_group; ++g) {
          std::vector<float> members(q.begin() + g * size, q.begin() + (g + 1) * size);
          std::sort(members.begin(), members.end(), std::greater<>());
          group_score[at(g)] = size > 1 ? members[0] + members[1] : members[0];
        }
        const std::vector<int32_t> groups = ranked(group_score);
        std::vector<bool> kept(at(o.n_group), false);
        for (int64_t i = 0; i < o.topk_group; ++i) kept[at(groups[at(i)])] = true;
        for (int32_t e : ranked(q))
          if (kept[at(e / size)]) chosen.push_back(e);
      } else {
        chosen = ranked(q);
      }
    }
    double sum = 0.0, max_z = -INFINITY;
    for (int64_t j = 0; j < k; ++j) {
      index[t * k + j] = chosen[at(j)];
      ++counts[at(chosen[at(j)])];
      sum += double{p[chosen[at(j)]]};
      max_z = std::max(max_z, double{z[chosen[at(j)]]});
    }
    double soft_sum = 0.0;
    for (int64_t j = 0; j < k; ++j) soft_sum += std::exp(double{z[chosen[at(j)]]} - max_z);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = chosen[at(j)];
      double w = double{p[e]};
      if (o.score == RouterScoreFunction::kTopkSoftmax)
        w = std::exp(double{z[e]} - max_z) / soft_sum;
      else if (o.norm_topk_prob)
        w /= sum;
      weight[t * k + j] = static_cast<float>(w * double{o.routed_scaling_factor});
    }
  }
}

void router_topk_backward(ConstTensorView logits, ConstTensorView /*scores*/,
                          ConstTensorView topk_index, ConstTensorView /*topk_weight*/,
                          ConstTensorView d_weight, const RouterLossGrads& g,
                          const RouterTopkOptions& o, TensorView dlogits) {
  constexpr const char* kOp = "router_topk_backward";
  const RouterDims s = router_dims(kOp, logits, o);
  const int64_t n = s.tokens, e_count = s.experts, k = o.top_k;
  const float* zp = logits.data<float>(kOp);
  const int32_t* index = topk_index.data<int32_t>(kOp);
  const float* dweight = d_weight.data<float>(kOp);
  // Token t reads row t / (N / G) of the load-balancing gradient (one row: every token).
  const float* lb_rows = nullptr;
  int64_t group_tokens = n;
  if (g.lb_score_grad.raw() != nullptr) {
    group_tokens = n / token_groups(kOp, "lb_score_grad", g.lb_score_grad, n, e_count);
    lb_rows = g.lb_score_grad.data<float>(kOp);
  }
  float* dzp = dlogits.data<float>(kOp);
  const bool sigmoid = o.score == RouterScoreFunction::kSigmoid;
  for (int64_t t = 0; t < n; ++t) {
    const float* lb = lb_rows != nullptr ? lb_rows + t / group_tokens * e_count : nullptr;
    const float* z = zp + t * e_count;
    const std::vector<double> soft = softmax(z, e_count);
    // The scores s(z) and their Jacobian ds_a/dz_b.
    std::vector<double> sc(at(e_count));
    std::vector<double> jac(at(e_count * e_count), 0.0);
    for (int64_t a = 0; a < e_count; ++a) {
      if (sigmoid) {
        const double sig = 1.0 / (1.0 + std::exp(-double{z[a]}));
        sc[at(a)] = sig + double{kSigmoidScoreEpsilon};
        jac[at(a * e_count + a)] = sig * (1.0 - sig);
      } else {
        sc[at(a)] = soft[at(a)];
        for (int64_t b = 0; b < e_count; ++b)
          jac[at(a * e_count + b)] = soft[at(a)] * ((a == b ? 1.0 : 0.0) - soft[at(b)]);
      }
    }
    // dL/ds from the routing weights: w_j = f s_j (/ sum of selected s when renormalised; the
    // topk_softmax weights equal that renormalisation of the softmax scores exactly).
    std::vector<double> dscore(at(e_count), 0.0);
    const double f = o.routed_scaling_factor;
    const bool renormalised = o.norm_topk_prob || o.score == RouterScoreFunction::kTopkSoftmax;
    double sel = 0.0;
    for (int64_t j = 0; j < k; ++j) sel += sc[at(index[t * k + j])];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t a = index[t * k + j];
      for (int64_t i = 0; i < k; ++i) {
        const int32_t b = index[t * k + i];
        // dw_i/ds_a
        const double dw = renormalised ? f * ((a == b ? 1.0 : 0.0) / sel - sc[at(b)] / (sel * sel))
                                       : f * (a == b ? 1.0 : 0.0);
        dscore[at(a)] += double{dweight[t * k + i]} * dw;
      }
    }
    std::vector<double> dz(at(e_count), 0.0);
    for (int64_t a = 0; a < e_count; ++a)
      for (int64_t b = 0; b < e_count; ++b) dz[at(b)] += dscore[at(a)] * jac[at(a * e_count + b)];
    if (lb != nullptr) {
      // p = softmax (HF style, or the scores of a softmax router), or s / sum(s) (sigmoid).
      for (int64_t a = 0; a < e_count; ++a)
        for (int64_t b = 0; b < e_count; ++b) {
          double dp_dz;
          if (!sigmoid || g.lb_uses_softmax) {
            dp_dz = soft[at(a)] * ((a == b ? 1.0 : 0.0) - soft[at(b)]);
          } else {
            double total = 0.0;
            for (double v : sc) total += v;
            // p_a = s_a / S: dp_a/dz_b = (delta_ab - p_a) s_b' / S.
            dp_dz = ((a == b ? 1.0 : 0.0) - sc[at(a)] / total) * jac[at(b * e_count + b)] / total;
          }
          dz[at(b)] += double{lb[a]} * dp_dz;
        }
    }
    if (g.z_grad_scale != 0.0f) {
      double max_z = z[0];
      for (int64_t e = 1; e < e_count; ++e) max_z = std::max(max_z, double{z[e]});
      double sum = 0.0;
      for (int64_t e = 0; e < e_count; ++e) sum += std::exp(double{z[e]} - max_z);
      const double lse = max_z + std::log(sum);
      for (int64_t e = 0; e < e_count; ++e)
        dz[at(e)] += double{g.z_grad_scale} * 2.0 * lse * soft[at(e)];
    }
    for (int64_t e = 0; e < e_count; ++e) dzp[t * e_count + e] = static_cast<float>(dz[at(e)]);
  }
}

void router_z_loss(ConstTensorView logits, TensorView z_loss) {
  const int64_t n = logits.size(0), e_count = logits.size(1);
  const float* zp = logits.data<float>("router_z_loss");
  double total = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const float* z = zp + t * e_count;
    double max_z = z[0];
    for (int64_t e = 1; e < e_count; ++e) max_z = std::max(max_z, double{z[e]});
    double sum = 0.0;
    for (int64_t e = 0; e < e_count; ++e) sum += std::exp(double{z[e]} - max_z);
    const double lse = max_z + std::log(sum);
    total += lse * lse;
  }
  *z_loss.data<double>("router_z_loss") = n > 0 ? total / static_cast<double>(n) : 0.0;
}

void router_probability_column_sums(ConstTensorView logits, ConstTensorView scores,
                                    RouterProbability probability, TensorView column_sums_view) {
  constexpr const char* kOp = "router_probability_column_sums";
  const int64_t n = logits.size(0), e_count = logits.size(1);
  const int64_t groups = token_groups(kOp, "column_sums", column_sums_view, n, e_count);
  const float* zp = logits.data<float>(kOp);
  const float* pp = scores.data<float>(kOp);
  const std::span<double> column_sums(column_sums_view.data<double>(kOp), at(groups * e_count));
  std::fill(column_sums.begin(), column_sums.end(), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    double* group_sums = column_sums.data() + t / (n / groups) * e_count;
    const float* p = pp + t * e_count;
    const std::vector<double> soft = softmax(zp + t * e_count, e_count);
    double row_sum = 0.0;
    for (int64_t e = 0; e < e_count; ++e) row_sum += double{p[e]};
    for (int64_t e = 0; e < e_count; ++e) {
      double v = double{p[e]};
      if (probability == RouterProbability::kSoftmaxOfLogits) v = soft[at(e)];
      if (probability == RouterProbability::kScoresOverRowSum) v /= row_sum;
      group_sums[e] += v;
    }
  }
}

void route_counts_by_group(ConstTensorView topk_index, TensorView counts_view) {
  constexpr const char* kOp = "route_counts_by_group";
  const GroupCountDims d = group_count_dims(kOp, topk_index, counts_view);
  const int32_t* index = topk_index.data<int32_t>(kOp);
  expect_expert_ids(kOp, index, d.tokens * d.top_k, d.experts);
  int64_t* counts = counts_view.data<int64_t>(kOp);
  std::fill_n(counts, d.groups * d.experts, int64_t{0});
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t j = 0; j < d.top_k; ++j)
      ++counts[t / (d.tokens / d.groups) * d.experts + index[t * d.top_k + j]];
}

}  // namespace moecore::kernels::reference
