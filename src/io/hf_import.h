// Reading a published Hugging Face model directory: config.json (OLMoE `olmoe`, Qwen3-MoE
// `qwen3_moe`, FlexOlmo `flex_olmo`, the reordered-norm OLMoE, and moecore's own `moecore`
// export) into a ModelConfig, and its weights (model.safetensors, or model.safetensors.index.json
// and its shards; F32 or BF16) into fp32 parameters.
//
// Strict, because broken conversions fail silently: a config.json key that changes the
// computation in a way moecore does not implement (rope_scaling, clip_qkv, attention_bias, a
// sliding window, sparse layers other than a dense prefix) is an error naming the key; every
// parameter of the configuration must be present with its exact shape, and every tensor in the
// files must be a parameter (a missing, unused or mis-shaped tensor is an error naming the tensor
// and its file); dtypes other than F32 and BF16 are refused.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "model/config.h"
#include "model/params.h"

namespace moecore::io {

struct HfModelConfig {
  ModelConfig model;
  std::string model_type;               // "olmoe", "qwen3_moe", "flex_olmo" or "moecore"
  int64_t max_position_embeddings = 0;  // 0 when config.json does not say
  std::optional<int32_t> eos_token_id;  // when config.json names a single one
};

// config.json's parsed contents; `origin` names it in errors.
HfModelConfig hf_model_config_from_json(const nlohmann::json& config, const std::string& origin);
// <dir>/config.json.
HfModelConfig read_hf_model_config(const std::string& dir);

struct HfWeightsRead {
  int64_t tensors = 0;
  int64_t files = 0;
  std::set<std::string> dtypes;  // "F32", "BF16"
};
// Loads <dir>'s weights into params (sized by layout) as fp32.
HfWeightsRead read_hf_weights(const ParamLayout& layout, const std::string& dir,
                              ParamBuffers& params);

}  // namespace moecore::io
