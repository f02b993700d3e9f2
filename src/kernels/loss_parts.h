// Where each part of a micro-batch's loss sits in the rows that moe_loss_terms writes, the model
// records and step_decision reads (nvcc compiles this header: no library types).
#pragma once

namespace moecore::kernels {

// ce: the cross-entropy; lb, z: the routers' load-balancing and z-losses (DESIGN.md); lm_z: the
// LM head's z-loss, OLMo-core's train-module z_loss_multiplier term: the mean over the counted
// targets of logsumexp(logits)^2. Each unscaled: the step's loss is ce + router_aux_loss_coef lb
// + router_z_loss_coef z + z_loss_multiplier lm_z.
enum LossPart : int { kCeLoss = 0, kLbLoss = 1, kZLoss = 2, kLmZLoss = 3 };
inline constexpr int kLossParts = 4;

// What cross_entropy writes per call (and the LM head per chunk): the cross-entropy, then the
// LM head's z-loss, both over the same divisor.
enum HeadLoss : int { kHeadCe = 0, kHeadZ = 1 };
inline constexpr int kHeadLosses = 2;

}  // namespace moecore::kernels
