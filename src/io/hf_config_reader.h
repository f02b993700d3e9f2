// Reading a Hugging Face config.json into moecore's ModelConfig (the inverse of io/hf_config.h):
// OLMoE `olmoe`, Qwen3-MoE `qwen3_moe`, FlexOlmo `flex_olmo` (OLMoE with OLMo-2's reordered
// norms) and moecore's own `moecore` export.
//
// Strict, because broken conversions fail silently: a key that changes the computation in a way
// moecore does not implement (rope_scaling, clip_qkv, attention_bias, a sliding window, hidden_act
// other than silu, sparse layers other than after a dense prefix) is an error naming the key, as
// is a missing architecture key or a value of the wrong type. Keys that do not change the
// computation (use_cache, initializer_range, torch_dtype, ...) are ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/config.h"

namespace moecore::io {

struct HfModelConfig {
  ModelConfig model;
  std::string model_type;  // "olmoe", "qwen3_moe", "flex_olmo" or "moecore"
  // Beyond the architecture (max_position_embeddings 0 when config.json does not say; BOS and PAD
  // ids outside the vocabulary are left out, an EOS id outside it is an error).
  HfModelInfo info;
};

// config.json's parsed contents; `origin` names it in errors.
HfModelConfig hf_model_config_from_json(const nlohmann::json& config, const std::string& origin);
// <dir>/config.json.
HfModelConfig read_hf_model_config(const std::string& dir);

// Only what config.json says beyond the architecture, read without judging the architecture (a
// checkpoint's own config.json, for generation and resumes); ids checked against `vocab_size`.
HfModelInfo hf_model_info_from_json(const nlohmann::json& config, const std::string& origin,
                                    int64_t vocab_size);
// eos_token_id's value in config.json or generation_config.json (`origin`): one id or a list of
// them; nullopt for null. Every entry must be a token id below vocab_size.
std::optional<std::vector<int32_t>> eos_token_ids_from_json(const nlohmann::json& eos,
                                                            const std::string& origin,
                                                            int64_t vocab_size, const char* tag);

// <dir>/config.json's, or nullopt when there is none.
std::optional<HfModelInfo> read_hf_model_info(const std::string& dir, int64_t vocab_size);

// The one spelling of an architecture that every reading of it shares, for comparing two of them:
// head_dim 0 for hidden_size / heads, and dense MLP width 0 without a dense layer (the families
// write these differently, OLMoE has no head_dim and calls the expert width intermediate_size).
ModelConfig canonical_architecture(ModelConfig m);

}  // namespace moecore::io
