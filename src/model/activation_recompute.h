// Activation recompute (train.recompute), decided per transformer block as OLMo-core's activation
// checkpointing does (olmo_core.nn.transformer.config.TransformerActivationCheckpointingMode):
//   none      keep every activation the backward needs (the default);
//   full      keep only each block's input (OLMo-core "full": every block checkpointed); the
//             backward re-runs the whole block from it before the block's backward;
//   attention keep the block input and the residual after attention; re-run the attention
//             sublayer (its norm, projections, RoPE, softmax) in the backward (OLMo-core
//             "selected_modules" with the blocks' attention modules);
//   moe       re-run the feed-forward sublayer (its norm and the MoE, or the dense MLP of a
//             first_k_dense_replace layer) in the backward (OLMo-core "selected_modules" with the
//             blocks' feed-forward modules). The router's state of each MoE layer stays (its
//             top-k, scores and counts: the batch statistics and the MoE metrics read it).
// The recomputed forward is the same deterministic computation on the same inputs, so losses and
// gradients are bit-identical to "none".
#pragma once

namespace moecore {

enum class ActivationRecompute { kNone, kFull, kMoe, kAttention };

// The train.recompute spelling.
inline const char* recompute_name(ActivationRecompute mode) {
  switch (mode) {
    case ActivationRecompute::kFull:
      return "full";
    case ActivationRecompute::kMoe:
      return "moe";
    case ActivationRecompute::kAttention:
      return "attention";
    case ActivationRecompute::kNone:
      break;
  }
  return "none";
}

inline bool recomputes_attention(ActivationRecompute mode) {
  return mode == ActivationRecompute::kFull || mode == ActivationRecompute::kAttention;
}
inline bool recomputes_ffn(ActivationRecompute mode) {
  return mode == ActivationRecompute::kFull || mode == ActivationRecompute::kMoe;
}

}  // namespace moecore
