// model/init_rule.h: each method's standard deviation and truncation for representative weights
// (tests/reference/test_olmo_core_init.py compares every tensor's distribution with OLMo-core's
// own initialisation).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/check.h"
#include "model/init_rule.h"
#include "model/params.h"

namespace moecore {
namespace {

ModelConfig model() {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_experts = 4;
  c.moe_intermediate_size = 48;
  c.shared_expert_intermediate_size = 32;
  c.first_k_dense_replace = 1;
  return c;
}

InitDistribution of(const ModelConfig& c, InitMethod method, const std::string& name,
                    double std = 0.02) {
  const ParamLayout layout = ParamLayout::build(c);
  const ParamSpec* spec = layout.find(name);
  EXPECT_NE(spec, nullptr) << name;
  return init_distribution(c, InitOptions{method, std, -1.0}, *spec);
}

TEST(InitRule, EachMethodsStdAndTruncation) {
  const ModelConfig c = model();
  const std::string o = "model.layers.2.self_attn.o_proj.weight";
  const std::string q = "model.layers.2.self_attn.q_proj.weight";
  const std::string down = "model.layers.2.mlp.experts.1.down_proj.weight";
  const std::string shared = "model.layers.2.mlp.shared_expert.up_proj.weight";
  // moecore: N(0, std) everywhere, untruncated.
  EXPECT_EQ(of(c, InitMethod::kMoecore, o).std, 0.02);
  EXPECT_FALSE(of(c, InitMethod::kMoecore, "model.embed_tokens.weight").truncated);
  // normal: the same std, truncated.
  EXPECT_TRUE(of(c, InitMethod::kNormal, down).truncated);
  EXPECT_EQ(of(c, InitMethod::kNormal, "lm_head.weight").std, 0.02);
  // llama: outputs and the MoE block at std / sqrt(2 L); q at std; embedding N(0, 1); head d^-1/2.
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kLlama, o).std, 0.02 / std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kLlama, shared).std, 0.02 / std::sqrt(8.0));
  EXPECT_EQ(of(c, InitMethod::kLlama, q).std, 0.02);
  EXPECT_EQ(of(c, InitMethod::kLlama, "model.embed_tokens.weight").std, 1.0);
  EXPECT_FALSE(of(c, InitMethod::kLlama, "model.embed_tokens.weight").truncated);
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kLlama, "lm_head.weight").std, 0.125);
  // llama_depth: layer 2 is the third: std / sqrt(6).
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kLlamaDepth, down).std, 0.02 / std::sqrt(6.0));
  // fan_in: fan-in^-1/2 (a routed expert's down: its hidden size), shared experts at std.
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kFanIn, down).std, 1.0 / std::sqrt(48.0));
  EXPECT_DOUBLE_EQ(of(c, InitMethod::kFanIn, "model.layers.2.mlp.gate.weight").std, 0.125);
  EXPECT_EQ(of(c, InitMethod::kFanIn, shared).std, 0.02);
  EXPECT_EQ(of(c, InitMethod::kFanIn, "model.layers.0.mlp.down_proj.weight").std, 0.02);
}

TEST(InitRule, TiedEmbeddingKeepsTheEmbeddingsRule) {
  ModelConfig c = model();
  c.tie_word_embeddings = true;
  const InitDistribution tied = of(c, InitMethod::kLlama, "model.embed_tokens.weight");
  EXPECT_EQ(tied.std, 1.0);
  EXPECT_FALSE(tied.truncated);
}

TEST(InitRule, EmbeddingStdAppliesWhereOlmoCoreReadsIt) {
  const ModelConfig c = model();
  const ParamLayout layout = ParamLayout::build(c);
  const ParamSpec& embedding = *layout.find("model.embed_tokens.weight");
  EXPECT_EQ(init_distribution(c, {InitMethod::kNormal, 0.02, 0.5}, embedding).std, 0.5);
  EXPECT_EQ(init_distribution(c, {InitMethod::kLlama, 0.02, 0.5}, embedding).std, 1.0);
}

}  // namespace
}  // namespace moecore
