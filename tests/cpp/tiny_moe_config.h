// The tiny MoE model that the block-level tests run (test_transformer_chunks.cpp,
// test_activation_recompute.cpp, test_bf16_weight_copies.cpp) and its random weights: GQA with one
// KV head, a dense first layer, 4 experts top-2 plus a shared expert, and router losses large
// enough to matter in every gradient.
#pragma once

#include <cstdint>
#include <random>

#include "model/config.h"
#include "model/params.h"

namespace moecore {

inline ModelConfig tiny_moe_config(int64_t layers) {
  ModelConfig c;
  c.vocab_size = 13;
  c.hidden_size = 8;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 6;
  c.intermediate_size = 10;
  c.first_k_dense_replace = 1;
  c.shared_expert_intermediate_size = 4;
  c.router_aux_loss_coef = 0.5;
  c.router_z_loss_coef = 0.05;
  return c;
}

// Every tensor of `layout` from U(-0.5, 0.5) (norm gains 1 + that), one stream seeded by `seed`.
inline void fill_tiny_params(const ParamLayout& layout, uint32_t seed, ParamBuffers& params) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (const ParamSpec& spec : layout.specs())
    for (size_t i = 0; i < spec.numel; ++i)
      params.at(spec)[i] = spec.is_norm ? 1.0f + u(rng) : u(rng);
}

}  // namespace moecore
