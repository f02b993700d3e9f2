// The compute primitives of moecore, on tensor views. One declaration per operation; the backend
// that defines them is chosen at build time (kernels/cpu/ now, kernels/cuda/ next), and
// kernels/reference/ holds a plain-loop oracle of each under kernels::reference with the same
// signature (the per-op harness, tests/cpp/test_kernel_ops.cpp, compares every backend with it).
// Model code composes these and holds no compute loop of its own.
//
// Views are contiguous f32 (i32 for token ids and targets) unless an operation says otherwise;
// a kernel checks shapes and dtypes and names itself in the error. Gradient rules
// (model/grad_rules.h): parameter gradients accumulate (+=), activation gradients overwrite (=)
// unless a flag says otherwise.
#pragma once

#include <cstdint>
#include <span>

#include "core/ignore_index.h"
#include "core/mx_types.h"
#include "core/tensor_view.h"
#include "kernels/gemm.h"
#include "kernels/loss_parts.h"
#include "kernels/padded_dispatch_shape.h"
#include "kernels/sigmoid_score_epsilon.h"

namespace moecore {

// The scalars of one AdamW update of a range of elements (torch.optim.AdamW's formula):
//   g *= grad_scale; p *= decay_factor; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   p -= step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with step_size = lr / (1 - b1^t), bias2_sqrt = sqrt(1 - b2^t), decay_factor = 1 - lr wd.
struct AdamWCoefficients {
  float decay_factor, b1, b2, bias2_sqrt, eps, step_size, grad_scale;
};
// The coefficients that change from step to step (the learning rate's schedule, the bias
// corrections), as adamw_update reads them from a tensor where the parameters are: f32 [3]
// {decay_factor, step_size, bias2_sqrt}. The host writes them before the step, so that a replayed
// CUDA graph's update follows the schedule instead of the values it was captured with.
inline constexpr int64_t kAdamWStepCoefficients = 3;

// How a router turns logits into scores: softmax over the experts, sigmoid, or softmax scores with
// routing weights that are the softmax over the k selected logits (topk_softmax).
enum class RouterScoreFunction : uint8_t { kSoftmax, kSigmoid, kTopkSoftmax };

// Which k experts a token takes: the best selection scores (learned routing), the best of
// per-(seed, global token) SplitMix64 draws (random), or experts (g k + j) mod E (balanced).
enum class RouterChoice : uint8_t { kTopScores, kRandom, kBalanced };

// The router's options (model/router.h spells out each rule).
struct RouterTopkOptions {
  RouterScoreFunction score = RouterScoreFunction::kSoftmax;
  int64_t top_k = 1;
  bool norm_topk_prob = false;
  int64_t n_group = 1;  // group-limited top-k; 1: plain top-k
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  RouterChoice choice = RouterChoice::kTopScores;
  uint64_t seed = 0;         // random: the layer's stream seed
  int64_t token_offset = 0;  // random, balanced: global index of row 0
};

// Gradients of the router's losses with respect to the probabilities they read:
// lb_score_grad [E] is added to dL/dp[t, e] for every token t, or [G, E]: row t / (N / G) to
// token t's (G equal groups of consecutive tokens, G dividing N: a load-balancing loss per
// instance, model.lb_loss_granularity = "instance"), p being softmax(logits) when
// lb_uses_softmax, else the scores (a sigmoid router's divided by their row sum first); an empty
// view: no load-balancing term. The z-loss adds z_grad_scale * d(sum_t lse_t^2)/dlogits.
struct RouterLossGrads {
  ConstTensorView lb_score_grad;
  bool lb_uses_softmax = false;
  float z_grad_scale = 0.0f;
};

// The per-expert probabilities whose column sums the load-balancing losses read.
enum class RouterProbability : uint8_t {
  kScores,            // the scores as they are
  kSoftmaxOfLogits,   // softmax(logits) whatever the score function (HF style)
  kScoresOverRowSum,  // each row's scores divided by their sum (OLMo-core, sigmoid router)
};

// The rules and normalisers of moe_loss_terms (DESIGN.md's losses; model/transformer.cpp sets
// them per micro-batch).
struct MoeLossOptions {
  // transformers' load_balancing_loss_func over every layer's routes together (lb_loss_style =
  // "hf"), else OLMo-core's (E / k) sum_e f_e P_e per layer, summed over the layers.
  bool lb_over_all_layers = false;
  int64_t top_k = 1;
  double router_loss_div = 0.0;  // f_e's and the z-loss's normaliser: counted labels or tokens
  double tokens = 0.0;  // tokens P_e is the mean over: the global micro-batch's (the rank's own
                        // under lb_loss_scope "rank" or instance granularity, its statistics
                        // the rank's), tokens / lb_groups per group
  double z_rows = 0.0;  // tokens behind each rank's mean logsumexp^2 (its micro-batch's)
  double aux_loss_coef = 0.0;  // model.router_aux_loss_coef, a factor of lb_score_grad
  // The groups of equal size P_e and f_e are per (lb_loss_granularity "instance": the
  // instances; 1: the tokens together): route_counts, router_sums and lb_score_grad hold a row
  // of E per group, each group's P_e the mean over its tokens / lb_groups tokens.
  int64_t lb_groups = 1;
};

// The scalars of step_decision: the clipping threshold, the step guard's limits (train/
// step_guard.h; +inf: none) and how the loss rows make the step's loss.
struct StepDecisionOptions {
  double max_grad_norm = 0.0;  // <= 0: no clipping
  double loss_limit = 0.0, norm_limit = 0.0;
  double lb_coef = 0.0, z_coef = 0.0;  // model.router_aux_loss_coef, model.router_z_loss_coef
  double lm_z_coef = 0.0;              // train.z_loss_multiplier
  double loss_scale = 1.0;             // each row's share of the step's loss
};

// What padded_dispatch_plan writes: i32 maps with -1 for "none", and two i64 results. A route's
// position is its place in the dispatch's send order (order_routes_by_expert's: by expert, token
// order within); a slot is a row of the padded all-to-all's send (or receive) buffer, [ranks *
// block_rows] rows, rank after rank; a row is a row of the experts' buffer, [capacity] rows.
struct PaddedDispatchMaps {
  TensorView slot_of_position;  // [N * k] the send slot of each position; -1: dropped
  TensorView position_of_slot;  // [slots] the position in each send slot; -1: empty
  TensorView token_of_slot;     // [slots] that route's token (route / k); -1: empty
  TensorView row_of_slot;       // [slots] each received slot's row; -1: empty
  TensorView slot_of_row;       // [capacity] each row's received slot; -1: past the rows kept
  TensorView expert_offsets;    // [local_experts + 1] i64 each local expert's rows
  TensorView dropped;           // [1] i64 this rank's routes the capacity dropped
};

// An MX-quantised operand as the MX ops read it: codes [..., k] (e4m3 or e5m2, the dtype says
// which) and their E8M0 block scales [..., k / 32] (e8m0), quantised along the last dimension, k,
// in blocks of 32 (mx_quantize or mx_quantize_transposed writes both).
struct MxOperandView {
  ConstTensorView codes;
  ConstTensorView scales;
};

}  // namespace moecore

// Every declaration twice from one list: kernels:: is the backend compiled in, and
// kernels::reference:: the oracle.
namespace moecore::kernels {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels

namespace moecore::kernels::reference {
#include "kernels/op_declarations.inc"
}  // namespace moecore::kernels::reference
