// The small MoE config that the planner tests (test_plan*.cpp) plan: 4 layers (the first dense),
// 8 experts top-2, a shared expert, GQA; batch 8 in 2 micro-batches. And the hardware they plan
// it on: a runtime-free machine, and round rates for the step-time model.
#pragma once

#include <string>
#include <vector>

#include "plan/hardware.h"
#include "train/run_config.h"

namespace moecore::plan {

inline const Hardware kNoRuntime{"test", 1e12, 0.0, "test", false, {}};

// 1 GFLOP/s fp32, 2 bf16, 1 GB/s memory; a slow link (0.1 GB/s, 1 us): the reductions matter.
inline Rates test_rates() {
  Rates r;
  r.gemm_flops_fp32 = r.peak_flops_fp32 = 1e9;
  r.gemm_flops_bf16 = r.peak_flops_bf16 = 2e9;
  r.memory_bandwidth = 1e9;
  r.link_bandwidth = 1e8;
  r.link_latency = 1e-6;
  return r;
}

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
