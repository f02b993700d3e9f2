// The Hugging Face config.json: OLMoE-compatible models say "olmoe", per-head q/k norm says
// "qwen3_moe" (dense first layers as mlp_only_layers), and anything transformers cannot compute
// says "moecore" with no architectures.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "io/hf_config.h"

namespace moecore::io {
namespace {

ModelConfig olmoe_like() {
  ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 40;
  c.intermediate_size = 128;
  c.qk_norm = QkNorm::kFull;
  c.router_score = RouterScore::kSoftmax;
  c.norm_topk_prob = false;
  return c;
}

TEST(HfConfig, OlmoeCompatible) {
  const ModelConfig c = olmoe_like();
  const nlohmann::json j = hf_config_json(c, 4096, 50279);
  EXPECT_EQ(j.at("model_type"), "olmoe");
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"OlmoeForCausalLM"}));
  EXPECT_EQ(j.at("intermediate_size"), 40);  // OLMoE's name for the expert width
  EXPECT_EQ(j.at("hidden_size"), 64);
  EXPECT_EQ(j.at("num_hidden_layers"), 3);
  EXPECT_EQ(j.at("num_attention_heads"), 4);
  EXPECT_EQ(j.at("num_key_value_heads"), 4);
  EXPECT_EQ(j.at("num_experts"), 8);
  EXPECT_EQ(j.at("num_experts_per_tok"), 2);
  EXPECT_EQ(j.at("norm_topk_prob"), false);
  EXPECT_EQ(j.at("vocab_size"), 100);
  EXPECT_EQ(j.at("max_position_embeddings"), 4096);
  EXPECT_EQ(j.at("eos_token_id"), 50279);
  EXPECT_EQ(j.at("tie_word_embeddings"), false);
  EXPECT_FALSE(j.contains("mlp_only_layers"));
  EXPECT_FALSE(j.contains("qk_norm"));

  // Training-only settings do not change the class.
  ModelConfig training = c;
  training.lb_loss_style = LbLossStyle::kHf;
  training.router_z_loss_coef = 0.01;
  EXPECT_EQ(hf_config_json(training, 4096, std::nullopt).at("model_type"), "olmoe");
  EXPECT_TRUE(hf_config_json(training, 4096, std::nullopt).at("eos_token_id").is_null());

  // An explicit head_dim equal to hidden / heads is still OLMoE.
  ModelConfig explicit_head = c;
  explicit_head.head_dim = 16;
  EXPECT_EQ(hf_config_json(explicit_head, 128, std::nullopt).at("model_type"), "olmoe");
}

TEST(HfConfig, PerHeadNormIsQwen3Moe) {
  ModelConfig c = olmoe_like();
  c.qk_norm = QkNorm::kPerHead;
  c.head_dim = 32;  // != hidden / heads: fine for Qwen3-MoE
  c.first_k_dense_replace = 2;
  c.norm_topk_prob = true;
  const nlohmann::json j = hf_config_json(c, 2048, 7);
  EXPECT_EQ(j.at("model_type"), "qwen3_moe");
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(j.at("head_dim"), 32);
  EXPECT_EQ(j.at("mlp_only_layers"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(j.at("moe_intermediate_size"), 40);
  EXPECT_EQ(j.at("intermediate_size"), 128);  // the dense layers' width
  EXPECT_EQ(j.at("decoder_sparse_step"), 1);
  EXPECT_EQ(j.at("norm_topk_prob"), true);
  EXPECT_EQ(j.at("max_window_layers"), 3);

  ModelConfig all_moe = c;
  all_moe.first_k_dense_replace = 0;
  all_moe.head_dim = 0;
  const nlohmann::json k = hf_config_json(all_moe, 2048, 7);
  EXPECT_EQ(k.at("model_type"), "qwen3_moe");
  EXPECT_EQ(k.at("head_dim"), 16);
  EXPECT_TRUE(k.at("mlp_only_layers").is_array());
  EXPECT_TRUE(k.at("mlp_only_layers").empty());
}

void expect_moecore(const ModelConfig& c) {
  const nlohmann::json j = hf_config_json(c, 512, std::nullopt);
  EXPECT_EQ(j.at("model_type"), "moecore");
  EXPECT_TRUE(j.at("architectures").is_array());
  EXPECT_TRUE(j.at("architectures").empty());
  EXPECT_EQ(j.at("moe_intermediate_size"), c.moe_intermediate_size);
  EXPECT_EQ(j.at("intermediate_size"), c.intermediate_size);
  EXPECT_EQ(j.at("head_dim"), c.head_size());
  EXPECT_EQ(j.at("first_k_dense_replace"), c.first_k_dense_replace);
  EXPECT_EQ(j.at("shared_expert_intermediate_size"), c.shared_expert_intermediate_size);
}

TEST(HfConfig, SigmoidOrSharedExpertIsMoecore) {
  ModelConfig sigmoid = olmoe_like();
  sigmoid.router_score = RouterScore::kSigmoid;
  expect_moecore(sigmoid);
  EXPECT_EQ(hf_config_json(sigmoid, 512, std::nullopt).at("router_score"), "sigmoid");
  ModelConfig sigmoid_qwen = sigmoid;
  sigmoid_qwen.qk_norm = QkNorm::kPerHead;
  expect_moecore(sigmoid_qwen);
  EXPECT_EQ(hf_config_json(sigmoid_qwen, 512, std::nullopt).at("qk_norm"), "per_head");

  ModelConfig shared = olmoe_like();
  shared.shared_expert_intermediate_size = 24;
  expect_moecore(shared);
  ModelConfig shared_qwen = shared;
  shared_qwen.qk_norm = QkNorm::kPerHead;
  expect_moecore(shared_qwen);
  EXPECT_EQ(hf_config_json(shared, 512, std::nullopt).at("router_score"), "softmax");
}

TEST(HfConfig, OlmoeWithUnsupportedShapeIsMoecore) {
  ModelConfig dense_first = olmoe_like();
  dense_first.first_k_dense_replace = 1;
  expect_moecore(dense_first);
  EXPECT_EQ(hf_config_json(dense_first, 512, std::nullopt).at("qk_norm"), "full");

  ModelConfig wide_heads = olmoe_like();
  wide_heads.head_dim = 32;
  expect_moecore(wide_heads);

  ModelConfig no_norm = olmoe_like();
  no_norm.qk_norm = QkNorm::kNone;
  expect_moecore(no_norm);
  EXPECT_EQ(hf_config_json(no_norm, 512, std::nullopt).at("qk_norm"), "none");
}

// block_norm = "reordered" on the OLMoE shape is transformers' FlexOlmo (OLMo-2 norms); anything
// else with reordered norms, and every router option no HF MoE class of these families has, is
// "moecore" with the option's key.
TEST(HfConfig, ReorderedOlmoeIsFlexOlmo) {
  ModelConfig c = olmoe_like();
  c.block_norm = BlockNorm::kReordered;
  const nlohmann::json j = hf_config_json(c, 512, std::nullopt);
  EXPECT_EQ(j.at("model_type"), "flex_olmo");
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"FlexOlmoForCausalLM"}));
  EXPECT_EQ(j.at("intermediate_size"), c.moe_intermediate_size);
  EXPECT_EQ(hf_config_json(olmoe_like(), 512, std::nullopt).at("model_type"), "olmoe");

  ModelConfig qwen = c;
  qwen.qk_norm = QkNorm::kPerHead;  // Qwen3-MoE has no reordered variant
  expect_moecore(qwen);
  EXPECT_EQ(hf_config_json(qwen, 512, std::nullopt).at("block_norm"), "reordered");
  ModelConfig dense_first = c;
  dense_first.first_k_dense_replace = 1;
  expect_moecore(dense_first);
}

TEST(HfConfig, RouterOptionsAreMoecore) {
  ModelConfig topk_softmax = olmoe_like();
  topk_softmax.router_score = RouterScore::kTopkSoftmax;
  expect_moecore(topk_softmax);
  EXPECT_EQ(hf_config_json(topk_softmax, 512, std::nullopt).at("router_score"), "topk_softmax");
  ModelConfig grouped = olmoe_like();
  grouped.n_group = 4;
  grouped.topk_group = 2;
  expect_moecore(grouped);
  EXPECT_EQ(hf_config_json(grouped, 512, std::nullopt).at("n_group"), 4);
  EXPECT_EQ(hf_config_json(grouped, 512, std::nullopt).at("topk_group"), 2);
  ModelConfig scaled = olmoe_like();
  scaled.routed_scaling_factor = 2.5;
  expect_moecore(scaled);
  EXPECT_EQ(hf_config_json(scaled, 512, std::nullopt).at("routed_scaling_factor"), 2.5);
  ModelConfig biased = olmoe_like();
  biased.qk_norm = QkNorm::kPerHead;
  biased.router_bias_update_rate = 1e-3;
  expect_moecore(biased);
  EXPECT_EQ(hf_config_json(biased, 512, std::nullopt).at("router_bias_update_rate"), 1e-3);
}

}  // namespace
}  // namespace moecore::io
