// The small MoE config that the planner tests (test_plan.cpp, test_plan_step_time.cpp) plan:
// 4 layers (the first dense), 8 experts top-2, a shared expert, GQA; batch 8 in 2 micro-batches.
#pragma once

#include <string>
#include <vector>

#include "train/run_config.h"

namespace moecore::plan {

inline RunConfig small_config(const std::vector<std::string>& overrides = {}) {
  const char* text = R"(
[model]
vocab_size = 64
hidden_size = 32
num_hidden_layers = 4
num_attention_heads = 4
num_key_value_heads = 2
num_experts = 8
num_experts_per_tok = 2
moe_intermediate_size = 16
intermediate_size = 48
first_k_dense_replace = 1
shared_expert_intermediate_size = 24
qk_norm = "full"
[train]
batch_size = 8
microbatches = 2
seq_len = 16
)";
  return parse_run_config(text, "small.toml", overrides);
}

}  // namespace moecore::plan
