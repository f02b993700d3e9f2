// Parameter counts of a model, from the same spec table the trainer allocates (model/params.h), so
// a count here is the number of floats a run holds, not a formula that could drift from it.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace moecore::plan {

struct ParamCounts {
  int64_t embedding = 0;       // model.embed_tokens
  int64_t lm_head = 0;         // lm_head (0 when tied to the embedding)
  int64_t attention = 0;       // q, k, v, o projections and QK-norm gains
  int64_t norms = 0;           // input, post-attention and final RMSNorm gains
  int64_t dense_mlp = 0;       // the first_k_dense_replace layers' SwiGLU MLPs
  int64_t routers = 0;         // mlp.gate of every MoE layer
  int64_t shared_experts = 0;  // always-on shared experts
  int64_t routed_experts = 0;  // all E experts of every MoE layer
  int64_t total = 0;
  // Touched by one token: everything but the routed experts, plus k of the E experts of each MoE
  // layer (OLMo-core's and OLMoE's "active" count includes the embedding and the LM head).
  int64_t active = 0;
};

ParamCounts count_params(const ModelConfig& config);

}  // namespace moecore::plan
