// The Hugging Face config.json written beside model.safetensors, so that
// transformers.AutoModelForCausalLM.from_pretrained loads a moecore checkpoint:
//   * OlmoeForCausalLM when qk_norm = "full", softmax router, no shared expert, no dense layers and
//     head_dim = hidden/heads (OLMoE calls the expert width intermediate_size);
//   * Qwen3MoeForCausalLM when qk_norm = "per_head", softmax router, no shared expert, pre-norm
//     (dense first layers become Qwen3-MoE's mlp_only_layers);
//   (the OLMoE / Qwen3-MoE / FlexOlmo router: softmax, no selection bias, no group limit, no
//   routed_scaling_factor);
//   * FlexOlmoForCausalLM for the OLMoE shape with block_norm = "reordered" (OLMo-2 norms);
//   * otherwise model_type "moecore" with moecore's own keys: no transformers class computes that
//     architecture, and saying so beats a config that loads into the wrong computation.
// Training-only settings (lb style, z-loss) do not change logits and do not select the class.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "model/config.h"

namespace moecore::io {

// What a config.json says beyond the architecture: carried from an imported or --init-from model
// to what moecore writes of it (import, checkpoints), so that transformers' generation settings
// and tools that read the context length see the source's.
struct HfModelInfo {
  int64_t max_position_embeddings = 0;
  // Generation stops at any of them; an empty list at none (transformers' generate checks the
  // sampled token against the list), nullopt when config.json names none.
  std::optional<std::vector<int32_t>> eos_token_ids;
  std::optional<int32_t> bos_token_id;  // pad_token_id is the model's (ModelConfig)
  bool output_router_logits = false;
};

nlohmann::json hf_config_json(const ModelConfig& config, const HfModelInfo& info);
// A model of moecore's own: its context length and the tokenizer's EOS, when there is one.
nlohmann::json hf_config_json(const ModelConfig& config, int64_t max_position_embeddings,
                              std::optional<int32_t> eos_token_id);

}  // namespace moecore::io
