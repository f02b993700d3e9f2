// Token-choice top-k router, in fp32.
//   logits = x W_r^T; scores = softmax(logits) (softmax, topk_softmax) or sigmoid(logits); each
//   token picks the k experts with the highest selection scores = scores + the selection bias
//   (auxiliary-loss-free balancing; zero without it). Ties go to the lower expert index (documented
//   rule; torch.topk leaves tie order unspecified). Group-limited (n_group > 1, DeepSeek-V3): the
//   experts form n_group equal groups, a group's score is the sum of its two best selection scores
//   (its one score with one expert per group), the topk_group best groups are kept (ties: lower
//   group) and the k experts are chosen inside them only (excluded experts are out of the race,
//   as in DeepSeek's and Megatron's code; transformers' port sets their selection score to 0.0
//   instead, which differs only when selection scores are negative).
//   Routing weights: the selected scores, divided by their sum when norm_topk_prob is set; with
//   topk_softmax the softmax over the k selected logits (norm_topk_prob has nothing left to do);
//   then times routed_scaling_factor. The bias never enters the weights.
// Routing modes (capacity benchmarks) change only which k experts are selected; the weights are
// still the router's scores of those experts, so the router keeps learning through them and
// through the load-balancing and z-losses, and router_backward is the same for every mode:
//   learned: top-k of the router scores;
//   random: top-k of uniform random scores (64-bit SplitMix64 draws, one per expert), from a stream
//     per (layer seed, global token index); highest random score first;
//   balanced: global token g takes experts (g * k + j) mod E for j = 0..k-1 (distinct, k <= E), so
//     the routes of a micro-batch are spread evenly over the experts: exactly equal counts when
//     its tokens * k is a multiple of E.
// The global token index g = token_offset + t: with data parallelism each rank passes the position
// of its slice in the micro-batch, so every layout draws the same routes for the same token.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/splitmix64.h"
#include "core/tensor_view.h"
#include "core/workspace.h"
#include "kernels/matmul_precision.h"
#include "model/config.h"

namespace moecore {

struct RouterSelection {
  Routing mode = Routing::kLearned;
  uint64_t seed = 0;            // random: this layer's stream seed (routing_layer_seed)
  int64_t token_offset = 0;     // global index of local token 0
  const float* bias = nullptr;  // learned: [E] added to the scores for selection only, or nullptr
};

// The seed of one forward pass (training step, micro-batch) and of one layer within it.
inline uint64_t routing_forward_seed(uint64_t train_seed, int64_t step, int64_t micro) {
  return mix64(mix64(mix64(train_seed ^ 0x726f7574696e6721ULL) + static_cast<uint64_t>(step)) +
               static_cast<uint64_t>(micro));
}
inline uint64_t routing_layer_seed(uint64_t forward_seed, int64_t layer) {
  return mix64(forward_seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(layer + 1));
}

struct RouterShape {
  int64_t tokens;
  int64_t dim;
  int64_t num_experts;
  int64_t top_k;
  RouterScore score;
  bool norm_topk_prob;
  int64_t n_group = 1;  // group-limited top-k (see above); 1: plain top-k
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  // The logits GEMM's operands (the recipe's router entry): fp32 unless a recipe says otherwise,
  // since bf16 rounding of the logits would flip near-tied routes.
  kernels::MatmulPrecision precision = kernels::MatmulPrecision::kFp32;
};

inline RouterShape router_shape_of(const ModelConfig& c, int64_t tokens) {
  return {tokens,
          c.hidden_size,
          c.num_experts,
          c.num_experts_per_tok,
          c.router_score,
          c.norm_topk_prob,
          c.n_group,
          c.topk_group,
          static_cast<float>(c.routed_scaling_factor)};
}

// What the forward saves for the backward and for the losses and metrics.
struct RouterState {
  // Input, set by the caller before router_forward (default: learned routing); kept with the rest.
  RouterSelection selection;
  DeviceArray<float> logits;        // [N, E]
  DeviceArray<float> scores;        // [N, E]
  DeviceArray<int32_t> topk_index;  // [N, k] selected experts, best first
  DeviceArray<float> topk_weight;   // [N, k] routing weights
  // [E] (token, slot) routes per expert, where the other tensors are: the local dispatch never
  // reads them on the host (its offsets come from the routes themselves); the losses' statistics
  // and the expert-parallel exchanges copy them (host_copy).
  DeviceArray<int64_t> expert_counts;
};

void router_forward(const RouterShape& s, const float* x, const float* w_router, RouterState& st);

// Gradients reaching the router, all with respect to quantities the forward produced: d_weight
// [N, k] dL/d topk_weight, and the router's own losses' (RouterLossGradients):
//   lb_score_grad: [lb_groups, E] a constant added to dL/d p[t, e] for every token t of each of
//     lb_groups equal groups of consecutive tokens (1, or the instances), where p is the
//     load-balancing probability: softmax of the logits when lb_uses_softmax (HF style), else the
//     scores, which for a sigmoid router are first divided by their sum over the experts (as
//     OLMo-core does: each token's probabilities then sum to 1, like softmax's);
//   z_grad_scale: the z-loss contributes z_grad_scale * d(sum_t lse_t^2)/dlogits.
// dx: [N, d] (+=); dw_router: [E, d] (+=).
struct RouterLossGradients {
  const float* lb_score_grad;  // or nullptr: no load-balancing term
  bool lb_uses_softmax;
  float z_grad_scale;
  int64_t lb_groups = 1;
};
struct RouterGrads {
  const float* d_weight;
  RouterLossGradients losses;
};
// The logits' gradient is a temporary from `workspace`.
void router_backward(const RouterShape& s, const float* x, const float* w_router,
                     const RouterState& st, const RouterGrads& g, float* dx, float* dw_router,
                     Workspace& workspace);

// The losses' statistics of one layer, each into an f64 view where the router's tensors are (the
// transformer gathers every layer's into one buffer and copies it to the host once).
// Unscaled per-layer router z-loss, z_loss [1]: mean over tokens of logsumexp(logits)^2.
void router_z_loss(const RouterShape& s, const RouterState& st, TensorView z_loss);

// Sum over tokens of softmax(logits) (column sums, [E], or [G, E]: per group of N / G consecutive
// tokens); the HF load-balancing loss uses softmax probabilities whatever the score function.
void router_softmax_column_sums(const RouterShape& s, const RouterState& st, TensorView sums);
void router_score_column_sums(const RouterShape& s, const RouterState& st, TensorView sums);
// The OLMo-core load-balancing probabilities' column sums: the scores (softmax), or each token's
// sigmoid scores divided by their sum.
void router_lb_column_sums(const RouterShape& s, const RouterState& st, TensorView sums);
// counts (=) [G, E]: the routes per expert of each group of N / G consecutive tokens (the
// instances of a micro-batch, for the load-balancing loss per instance).
void router_group_counts(const RouterShape& s, const RouterState& st, TensorView counts);

}  // namespace moecore
