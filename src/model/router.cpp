#include "model/router.h"

#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

namespace {

RouterTopkOptions topk_options(const RouterShape& s, const RouterSelection& sel) {
  RouterTopkOptions o;
  switch (s.score) {
    case RouterScore::kSoftmax:
      o.score = RouterScoreFunction::kSoftmax;
      break;
    case RouterScore::kSigmoid:
      o.score = RouterScoreFunction::kSigmoid;
      break;
    case RouterScore::kTopkSoftmax:
      o.score = RouterScoreFunction::kTopkSoftmax;
      break;
  }
  switch (sel.mode) {
    case Routing::kLearned:
      o.choice = RouterChoice::kTopScores;
      break;
    case Routing::kRandom:
      o.choice = RouterChoice::kRandom;
      break;
    case Routing::kBalanced:
      o.choice = RouterChoice::kBalanced;
      break;
  }
  o.top_k = s.top_k;
  o.norm_topk_prob = s.norm_topk_prob;
  o.n_group = s.n_group;
  o.topk_group = s.topk_group;
  o.routed_scaling_factor = s.routed_scaling_factor;
  o.seed = sel.seed;
  o.token_offset = sel.token_offset;
  return o;
}

ConstTensorView logits_of(const RouterShape& s, const RouterState& st) {
  return view(st.logits.data(), {s.tokens, s.num_experts});
}

void column_sums(const RouterShape& s, const RouterState& st, RouterProbability probability,
                 TensorView sums) {
  kernels::router_probability_column_sums(
      logits_of(s, st), view(st.scores.data(), {s.tokens, s.num_experts}), probability, sums);
}

}  // namespace

void router_forward(const RouterShape& s, const float* x, const float* w_router, RouterState& st) {
  const int64_t n = s.tokens, e_count = s.num_experts, k = s.top_k;
  st.logits.resize(static_cast<size_t>(n * e_count));
  st.scores.resize(st.logits.size());
  st.topk_index.resize(static_cast<size_t>(n * k));
  st.topk_weight.resize(st.topk_index.size());
  st.expert_counts.resize(static_cast<size_t>(e_count));
  linear_forward(s.precision, x, view(w_router, {e_count, s.dim}), st.logits.data(), n, s.dim,
                 e_count);
  const ConstTensorView bias =
      st.selection.bias != nullptr ? view(st.selection.bias, {e_count}) : ConstTensorView{};
  kernels::router_topk_forward(
      logits_of(s, st), bias, topk_options(s, st.selection), view(st.scores.data(), {n, e_count}),
      view(st.topk_index.data(), {n, k}), view(st.topk_weight.data(), {n, k}),
      view(st.expert_counts.data(), {e_count}));
}

void router_backward(const RouterShape& s, const float* x, const float* w_router,
                     const RouterState& st, const RouterGrads& g, float* dx, float* dw_router,
                     Workspace& workspace) {
  const int64_t n = s.tokens, e_count = s.num_experts, k = s.top_k;
  Workspace::Scope scratch(workspace);
  const std::span<float> dlogits = scratch.zeroed<float>(n * e_count);
  const RouterLossGradients& losses = g.losses;
  const RouterLossGrads loss_grads{losses.lb_score_grad != nullptr
                                       ? view(losses.lb_score_grad, {losses.lb_groups, e_count})
                                       : ConstTensorView{},
                                   losses.lb_uses_softmax, losses.z_grad_scale};
  kernels::router_topk_backward(
      logits_of(s, st), view(st.scores.data(), {n, e_count}), view(st.topk_index.data(), {n, k}),
      view(st.topk_weight.data(), {n, k}), view(g.d_weight, {n, k}), loss_grads,
      topk_options(s, st.selection), view(dlogits.data(), {n, e_count}));
  linear_backward(s.precision, dlogits.data(), x, view(w_router, {e_count, s.dim}), dx, dw_router,
                  n, s.dim, e_count, true);
}

void router_z_loss(const RouterShape& s, const RouterState& st, TensorView z_loss) {
  kernels::router_z_loss(logits_of(s, st), z_loss);
}

void router_softmax_column_sums(const RouterShape& s, const RouterState& st, TensorView sums) {
  column_sums(s, st,
              s.score == RouterScore::kSigmoid ? RouterProbability::kSoftmaxOfLogits
                                               : RouterProbability::kScores,
              sums);
}

void router_score_column_sums(const RouterShape& s, const RouterState& st, TensorView sums) {
  column_sums(s, st, RouterProbability::kScores, sums);
}

void router_lb_column_sums(const RouterShape& s, const RouterState& st, TensorView sums) {
  column_sums(s, st,
              s.score == RouterScore::kSigmoid ? RouterProbability::kScoresOverRowSum
                                               : RouterProbability::kScores,
              sums);
}

void router_group_counts(const RouterShape& s, const RouterState& st, TensorView counts) {
  kernels::route_counts_by_group(view(st.topk_index.data(), {s.tokens, s.top_k}), counts);
}

}  // namespace moecore
