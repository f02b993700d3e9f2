// Model FLOPs per trained token (DESIGN.md, Measuring): forward + backward = 6 FLOPs per weight a
// token touches, plus the attention scores, the causal ones only (OLMo-core's
// num_flops_per_token counts 6 per non-embedding weight and the scores of all seq_len positions,
// 12 x heads x head_dim x seq_len: 4.7% more than this count on the bench model). Per layer:
//   attention projections 6 x (q, k, v, o weights); attention scores 12 x heads x head_dim x
//   (causal positions / seq_len) = 12 x heads x head_dim x (seq_len + 1) / 2; router 6 x d x E;
//   routed experts 18 x d x H x k; shared expert 18 x d x H_shared; a dense layer's SwiGLU MLP
//   18 x d x intermediate_size; and once the LM head 6 x d x V. Embedding lookups, norms,
//   activations and the optimizer are not counted. MFU = tokens/s x total / measured peak FLOP/s.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace moecore {

struct FlopsPerToken {
  double attention_projections = 0.0;
  double attention_scores = 0.0;
  double router = 0.0;
  double experts = 0.0;        // routed experts
  double shared_expert = 0.0;  // always-on shared expert
  double dense_mlp = 0.0;      // first_k_dense_replace layers
  double lm_head = 0.0;
  double total() const {
    return attention_projections + attention_scores + router + experts + shared_expert + dense_mlp +
           lm_head;
  }
};

FlopsPerToken flops_per_token(const ModelConfig& config, int64_t seq_len);

}  // namespace moecore
