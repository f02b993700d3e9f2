// The losses from their statistics and the selection-bias step, the plain-loop oracle: the
// formulas of DESIGN.md in double, in layer then expert order (lb: each layer's and group's sum
// over the experts, added in layer and group order; transformers' form: each expert's term over
// all layers, added in expert order).
#include <vector>

#include "kernels/moe_loss_checks.h"
#include "kernels/ops.h"
#include "kernels/step_decision_checks.h"

namespace moecore::kernels::reference {

void moe_loss_terms(ConstTensorView route_counts, ConstTensorView router_sums,
                    ConstTensorView head_losses, const MoeLossOptions& o, TensorView losses,
                    TensorView lb_score_grad, TensorView route_tally) {
  constexpr const char* kOp = "moe_loss_terms";
  const MoeLossDims dims = moe_loss_dims(kOp, route_counts, router_sums, head_losses, o, losses,
                                         lb_score_grad, route_tally);
  const int64_t layers = dims.layers, experts = dims.experts, groups = dims.groups;
  const int64_t* counts = route_counts.data<int64_t>(kOp);
  const double* sums = router_sums.data<double>(kOp);
  float* grad = lb_score_grad.data<float>(kOp);
  // Layer j's values: per group g a row of experts, then (sums) the mean logsumexp^2.
  auto at = [&](int64_t j, int64_t g, int64_t e) { return (j * groups + g) * experts + e; };
  auto count = [&](int64_t j, int64_t g, int64_t e) {
    return static_cast<double>(counts[at(j, g, e)]);
  };
  auto probability_sum = [&](int64_t j, int64_t g, int64_t e) {
    return sums[j * (groups * experts + 1) + g * experts + e];
  };
  auto mean_lse_squared = [&](int64_t j) {
    return sums[j * (groups * experts + 1) + groups * experts];
  };

  double ce = 0.0, lb = 0.0, z = 0.0, lm_z = 0.0;
  const double* head = head_losses.data<double>(kOp);
  for (int64_t c = 0; c < dims.head_chunks; ++c) {
    ce += head[kHeadLosses * c + kHeadCe];
    lm_z += head[kHeadLosses * c + kHeadZ];
  }
  for (int64_t i = 0; i < layers * groups * experts; ++i) grad[i] = 0.0f;
  if (layers > 0 && o.tokens > 0.0 && o.router_loss_div > 0.0) {
    const double div = o.router_loss_div, tokens = o.tokens;
    const double e_count = static_cast<double>(experts);
    // z = sum over layers of (sum over tokens of lse^2) / div.
    for (int64_t j = 0; j < layers; ++j) z += mean_lse_squared(j) * o.z_rows / div;
    if (!o.lb_over_all_layers) {
      // OLMo-core: (E / k) sum_g sum_e f_ge P_ge per layer, f_ge = the group's routes / div,
      // P_ge = its probability sum / its tokens (one group: the micro-batch, OLMo-core's
      // local_batch granularity; the instances: its instance granularity);
      // d/dp[t, e] = coef (E / k) f_ge / group tokens for a token t of group g.
      // Each layer's and group's terms are summed over the experts, then added to lb.
      const double scale = e_count / static_cast<double>(o.top_k);
      const double group_tokens = tokens / static_cast<double>(groups);
      for (int64_t j = 0; j < layers; ++j)
        for (int64_t g = 0; g < groups; ++g) {
          double layer_group_lb = 0.0;
          for (int64_t e = 0; e < experts; ++e) {
            const double f = count(j, g, e) / div;
            layer_group_lb += scale * f * probability_sum(j, g, e) / group_tokens;
            grad[at(j, g, e)] = static_cast<float>(o.aux_loss_coef * scale * f / group_tokens);
          }
          lb += layer_group_lb;
        }
    } else {
      // transformers: every layer's routes as one set of rows = tokens x layers; E sum_e f_e P_e
      // with f_e and P_e over all of them, the same gradient for every layer (one group).
      const double rows = tokens * static_cast<double>(layers);
      for (int64_t e = 0; e < experts; ++e) {
        double all_counts = 0.0, all_probabilities = 0.0;
        for (int64_t j = 0; j < layers; ++j) {
          all_counts += count(j, 0, e);
          all_probabilities += probability_sum(j, 0, e);
        }
        const double f = all_counts / rows;
        lb += e_count * f * all_probabilities / rows;
        const float g = static_cast<float>(o.aux_loss_coef * e_count * f / rows);
        for (int64_t j = 0; j < layers; ++j) grad[at(j, 0, e)] = g;
      }
    }
  }
  double* out = losses.data<double>(kOp);
  out[kCeLoss] = ce;
  out[kLbLoss] = lb;
  out[kZLoss] = z;
  out[kLmZLoss] = lm_z;
  if (view_given(route_tally)) {
    double* tally = route_tally.data<double>(kOp);
    for (int64_t j = 0; j < layers; ++j)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t e = 0; e < experts; ++e) tally[j * experts + e] += count(j, g, e);
  }
}

void router_bias_update(ConstTensorView counts_view, float rate, ConstTensorView step_factors,
                        TensorView bias_view) {
  constexpr const char* kOp = "router_bias_update";
  const int64_t experts = router_bias_update_experts(kOp, counts_view, bias_view);
  expect_step_factors(kOp, step_factors);
  if (experts == 0) return;
  if (view_given(step_factors) && step_factors.data<float>(kOp)[1] == 0.0f) return;
  const double* counts = counts_view.data<double>(kOp);
  float* bias = bias_view.data<float>(kOp);
  double total = 0.0;
  for (int64_t e = 0; e < experts; ++e) total += counts[e];
  const double mean = total / static_cast<double>(experts);
  for (int64_t e = 0; e < experts; ++e) {
    const double gap = mean - counts[e];
    const float sign = gap > 0.0 ? 1.0f : (gap < 0.0 ? -1.0f : 0.0f);
    bias[e] = bias[e] + rate * sign;
  }
}

}  // namespace moecore::kernels::reference
