// config.json -> ModelConfig (io/hf_config_reader.h): moecore's own export of every family reads
// back as the same architecture, and keys moecore cannot compute are refused by name.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "io/hf_config.h"
#include "io/hf_config_reader.h"
#include "train/run_config.h"

namespace moecore::io {
namespace {

ModelConfig base() {
  ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 40;
  c.intermediate_size = 40;
  c.rope_theta = 50000.0;
  c.rms_norm_eps = 1e-6;
  c.norm_topk_prob = true;
  return c;
}

void expect_round_trip(const ModelConfig& c, const std::string& model_type) {
  const nlohmann::json j = hf_config_json(c, 2048, 7);
  const HfModelConfig read = hf_model_config_from_json(j, "config.json");
  EXPECT_EQ(read.model_type, model_type);
  EXPECT_EQ(model_config_difference(read.model, c), "");
  EXPECT_EQ(read.info.max_position_embeddings, 2048);
  EXPECT_EQ(read.info.eos_token_ids, std::vector<int32_t>{7});
}

TEST(HfConfigReader, ExportedFamiliesReadBackAsTheSameArchitecture) {
  expect_round_trip(base(), "olmoe");
  ModelConfig flex = base();
  flex.block_norm = BlockNorm::kReordered;
  expect_round_trip(flex, "flex_olmo");
  ModelConfig qwen = base();
  qwen.qk_norm = QkNorm::kPerHead;
  qwen.head_dim = 32;
  qwen.first_k_dense_replace = 1;
  qwen.intermediate_size = 96;
  expect_round_trip(qwen, "qwen3_moe");
  ModelConfig own = base();
  own.router_score = RouterScore::kSigmoid;
  own.shared_expert_intermediate_size = 24;
  own.head_dim = 16;
  own.n_group = 4;
  own.topk_group = 2;
  expect_round_trip(own, "moecore");
}

std::string error_of(const nlohmann::json& j) {
  try {
    hf_model_config_from_json(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfigReader, RefusesWhatMoecoreDoesNotCompute) {
  nlohmann::json olmoe = hf_config_json(base(), 2048, 7);
  nlohmann::json j = olmoe;
  j["clip_qkv"] = 8.0;
  EXPECT_NE(error_of(j).find("'clip_qkv'"), std::string::npos);
  j = olmoe;
  j["rope_scaling"] = {{"rope_type", "yarn"}};
  EXPECT_NE(error_of(j).find("'rope_scaling'"), std::string::npos);
  j = olmoe;
  j["attention_dropout"] = 0.1;
  EXPECT_NE(error_of(j).find("'attention_dropout' = 0.1 is not supported"), std::string::npos);
  j["attention_dropout"] = 0.0;  // transformers' default, written by its configs
  EXPECT_EQ(error_of(j), "");
  j = olmoe;
  j["model_type"] = "deepseek_v3";
  EXPECT_NE(error_of(j).find("deepseek_v3"), std::string::npos);
  j = olmoe;
  j.erase("num_experts");
  EXPECT_NE(error_of(j).find("missing key 'num_experts'"), std::string::npos);

  ModelConfig q = base();
  q.qk_norm = QkNorm::kPerHead;
  nlohmann::json qwen = hf_config_json(q, 2048, std::nullopt);
  j = qwen;
  j["mlp_only_layers"] = {2};  // a dense layer after sparse ones
  EXPECT_NE(error_of(j).find("layer 2 is dense after a sparse one"), std::string::npos);
  j = qwen;
  j["decoder_sparse_step"] = 2;  // layers 0 and 2 dense
  EXPECT_NE(error_of(j).find("layer 2 is dense"), std::string::npos);
  j = qwen;
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of(j).find("'use_sliding_window'"), std::string::npos);
  j = qwen;
  j["mlp_only_layers"] = {0, 1};
  EXPECT_EQ(hf_model_config_from_json(j, "config.json").model.first_k_dense_replace, 2);
}

// Keys transformers' models read that moecore would otherwise pass over: each refused by name
// where it changes the model, accepted at the value moecore computes.
TEST(HfConfigReader, RefusesRotaryAndLayerKeysItDoesNotCompute) {
  const nlohmann::json olmoe = hf_config_json(base(), 2048, 7);
  nlohmann::json j = olmoe;
  j["partial_rotary_factor"] = 0.5;
  EXPECT_NE(error_of(j).find("'partial_rotary_factor' = 0.5 is not supported"), std::string::npos);
  j["partial_rotary_factor"] = 1;
  EXPECT_EQ(error_of(j), "");
  j = olmoe;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  EXPECT_NE(error_of(j).find("'layer_types' holds \"sliding_attention\""), std::string::npos);
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(error_of(j), "");
  // OLMoE's attention is hidden_size / heads = 16 wide whatever head_dim says.
  j = olmoe;
  j["head_dim"] = 32;
  EXPECT_NE(error_of(j).find("'head_dim' = 32 is not supported for olmoe"), std::string::npos);
  j["head_dim"] = 16;
  EXPECT_EQ(error_of(j), "");
}

// An absent num_key_value_heads is each class's default: the heads for OlmoeConfig and
// FlexOlmoConfig (multi-head attention), 4 for Qwen3MoeConfig.
TEST(HfConfigReader, AbsentKeyValueHeadsAreEachFamilysDefault) {
  ModelConfig c = base();
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  nlohmann::json olmoe = hf_config_json(c, 2048, 7);
  olmoe.erase("num_key_value_heads");
  EXPECT_EQ(hf_model_config_from_json(olmoe, "config.json").model.num_key_value_heads, 8);
  c.qk_norm = QkNorm::kPerHead;
  nlohmann::json qwen = hf_config_json(c, 2048, 7);
  ASSERT_EQ(qwen["model_type"], "qwen3_moe");
  qwen.erase("num_key_value_heads");
  EXPECT_EQ(hf_model_config_from_json(qwen, "config.json").model.num_key_value_heads, 4);
}

TEST(HfConfigReader, KeepsWhatConfigJsonSaysBeyondTheArchitecture) {
  // Token ids (a list of EOS ids as Qwen3 and Llama-3 write them), the context length and the
  // router-logits flag survive import -> export, and moecore's z-loss coefficient its own export.
  ModelConfig c = base();
  c.router_z_loss_coef = 1e-3;
  HfModelInfo info;
  info.max_position_embeddings = 4096;
  info.eos_token_ids = {2, 3};
  info.bos_token_id = 1;
  c.pad_token_id = 4;
  info.output_router_logits = true;
  const nlohmann::json j = hf_config_json(c, info);
  EXPECT_EQ(j.at("eos_token_id"), nlohmann::json::array({2, 3}));
  const HfModelConfig read = hf_model_config_from_json(j, "config.json");
  EXPECT_EQ(read.info.eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(read.info.bos_token_id, 1);
  EXPECT_EQ(read.model.pad_token_id, 4);
  EXPECT_TRUE(read.info.output_router_logits);
  EXPECT_EQ(read.info.max_position_embeddings, 4096);
  EXPECT_EQ(read.model.router_z_loss_coef, 1e-3);
  EXPECT_EQ(hf_config_json(read.model, read.info), j);
  // A PAD id that names no token of the vocabulary (Llama's -1) is left out.
  nlohmann::json beyond = j;
  beyond["pad_token_id"] = -1;
  EXPECT_EQ(hf_model_config_from_json(beyond, "config.json").model.pad_token_id, -1);
}

TEST(HfConfigReader, EosIdsFollowGenerationConfigsRules) {
  // config.json's eos_token_id is read as generation_config.json's (one reader): an id outside
  // the vocabulary is an error naming the file and the id, in either file.
  const nlohmann::json j = hf_config_json(base(), 2048, 7);
  for (const nlohmann::json& eos :
       {nlohmann::json::array({2, 100}), nlohmann::json(-1), nlohmann::json("</s>")}) {
    SCOPED_TRACE(eos.dump());
    nlohmann::json beyond = j;
    beyond["eos_token_id"] = eos;
    const std::string error = error_of(beyond);
    EXPECT_NE(error.find("[import] config.json: eos_token_id holds"), std::string::npos) << error;
    EXPECT_NE(error.find("vocab_size=100"), std::string::npos) << error;
    try {
      eos_token_ids_from_json(eos, "generation_config.json", 100, "[generate]");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[generate] generation_config.json: eos_token_id holds"),
                std::string::npos)
          << e.what();
    }
  }
  // An empty list names no EOS (generation stops at none), unlike an absent or null key, and an
  // export keeps it.
  nlohmann::json none = j;
  none["eos_token_id"] = nlohmann::json::array();
  const HfModelConfig read = hf_model_config_from_json(none, "config.json");
  ASSERT_TRUE(read.info.eos_token_ids.has_value());
  EXPECT_TRUE(read.info.eos_token_ids->empty());
  EXPECT_EQ(hf_config_json(read.model, read.info).at("eos_token_id"), nlohmann::json::array());
  none["eos_token_id"] = nullptr;
  EXPECT_FALSE(hf_model_config_from_json(none, "config.json").info.eos_token_ids.has_value());
}

TEST(HfConfigReader, ReadsTransformersFiveRopeParametersAndSwish) {
  nlohmann::json j = hf_config_json(base(), 2048, 7);
  // transformers 5.x: rope_theta inside rope_parameters, none at the top.
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(hf_model_config_from_json(j, "config.json").model.rope_theta, 1e6);
  j["rope_theta"] = 1e4;  // both, disagreeing
  EXPECT_NE(error_of(j).find("differ"), std::string::npos);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  EXPECT_NE(error_of(j).find("'rope_parameters'"), std::string::npos);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("'factor'"), std::string::npos);
  j = hf_config_json(base(), 2048, 7);
  j["rope_scaling"] = {{"rope_type", "default"}};  // unscaled, spelt out
  EXPECT_EQ(error_of(j), "");
  j["hidden_act"] = "swish";  // transformers' ACT2FN: the same function as silu
  EXPECT_EQ(error_of(j), "");
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("'hidden_act'"), std::string::npos);
}

}  // namespace
}  // namespace moecore::io
