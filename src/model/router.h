// Token-choice top-k router, in fp32.
//   logits = x W_r^T; scores = softmax(logits) or sigmoid(logits); each token picks the k experts
//   with the highest scores. Ties go to the lower expert index (documented rule; torch.topk leaves
//   tie order unspecified). Routing weights are the selected scores, divided by their sum when
//   norm_topk_prob is set.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace moecore {

struct RouterShape {
  int64_t tokens;
  int64_t dim;
  int64_t num_experts;
  int64_t top_k;
  RouterScore score;
  bool norm_topk_prob;
};

// What the forward saves for the backward and for the losses and metrics.
struct RouterState {
  std::vector<float> logits;           // [N, E]
  std::vector<float> scores;           // [N, E]
  std::vector<int32_t> topk_index;     // [N, k] selected experts, best first
  std::vector<float> topk_weight;      // [N, k] routing weights
  std::vector<int64_t> expert_counts;  // [E] (token, slot) routes per expert
};

void router_forward(const RouterShape& s, const float* x, const float* w_router, RouterState& st);

// Gradients reaching the router, all with respect to quantities the forward produced:
//   d_weight: [N, k] dL/d topk_weight;
//   lb_score_grad: [E] a constant added to dL/d p[t, e] for every token t, where p is the
//     load-balancing probability (softmax of the logits when lb_uses_softmax, else the scores);
//   z_grad_scale: the z-loss contributes z_grad_scale * d(sum_t lse_t^2)/dlogits.
// dx: [N, d] (+=); dw_router: [E, d] (+=).
struct RouterGrads {
  const float* d_weight;
  const float* lb_score_grad;
  bool lb_uses_softmax;
  float z_grad_scale;
};
void router_backward(const RouterShape& s, const float* x, const float* w_router,
                     const RouterState& st, const RouterGrads& g, float* dx, float* dw_router);

// Unscaled per-layer router z-loss: mean over tokens of logsumexp(logits)^2.
double router_z_loss(const RouterShape& s, const RouterState& st);

// Sum over tokens of softmax(logits) (column sums, [E]); the HF load-balancing loss uses softmax
// probabilities whatever the score function.
std::vector<double> router_softmax_column_sums(const RouterShape& s, const RouterState& st);
std::vector<double> router_score_column_sums(const RouterShape& s, const RouterState& st);

}  // namespace moecore
