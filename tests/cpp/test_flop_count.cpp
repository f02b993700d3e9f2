// FLOPs per token (model/flop_count.h) against a count done by hand from DESIGN.md's rule.
#include <gtest/gtest.h>

#include "model/flop_count.h"

namespace moecore {
namespace {

TEST(FlopCount, MatchesHandCount) {
  ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;  // head_dim 16
  c.num_key_value_heads = 2;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.shared_expert_intermediate_size = 16;
  c.first_k_dense_replace = 1;  // layer 0 dense (width 128), layer 1 MoE
  c.intermediate_size = 128;
  const FlopsPerToken f = flops_per_token(c, 8);
  // q, o: 64 x 64; k, v: 64 x 32 -> 12288 weights per layer, 6 FLOPs each, 2 layers.
  EXPECT_DOUBLE_EQ(f.attention_projections, 2 * 6 * 12288.0);
  // 12 x 4 heads x 16 x (36 causal positions / 8 tokens), 2 layers.
  EXPECT_DOUBLE_EQ(f.attention_scores, 2 * 12 * 4 * 16 * 4.5);
  EXPECT_DOUBLE_EQ(f.router, 6 * 64 * 8.0);           // one MoE layer
  EXPECT_DOUBLE_EQ(f.experts, 18 * 64 * 32 * 2.0);    // k = 2 experts of width 32
  EXPECT_DOUBLE_EQ(f.shared_expert, 18 * 64 * 16.0);  // one MoE layer
  EXPECT_DOUBLE_EQ(f.dense_mlp, 18 * 64 * 128.0);     // one dense layer
  EXPECT_DOUBLE_EQ(f.lm_head, 6 * 64 * 100.0);
  EXPECT_DOUBLE_EQ(f.total(), 435456.0);
}

TEST(FlopCount, RoutedExpertsScaleWithTopKNotExpertCount) {
  ModelConfig c;
  c.num_experts = 8;
  c.num_experts_per_tok = 4;
  const FlopsPerToken few = flops_per_token(c, 128);
  c.num_experts = 128;
  const FlopsPerToken many = flops_per_token(c, 128);
  EXPECT_DOUBLE_EQ(few.experts, many.experts);
  EXPECT_DOUBLE_EQ(many.router, 16.0 * few.router);
}

}  // namespace
}  // namespace moecore
