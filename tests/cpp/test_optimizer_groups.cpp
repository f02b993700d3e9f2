// optim.group_overrides (OLMo-core's OptimGroupOverride): which tensors each group holds, by
// moecore's names and OLMo-core's, the refusals, and AdamW's update of each group with the
// group's own values: bit for bit the update of a run whose [optim] holds those values.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "gradcheck.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/optim_config.h"
#include "optim/optimizer_groups.h"

namespace moecore {
namespace {

// Two layers, the first dense; a shared expert and a selection bias (a buffer) in the second.
ModelConfig grouped_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 3;
  c.intermediate_size = 6;
  c.first_k_dense_replace = 1;
  c.shared_expert_intermediate_size = 5;
  c.router_bias_update_rate = 1e-3;
  c.block_norm = BlockNorm::kReordered;
  return c;
}

std::vector<std::string> names_in(const ParamLayout& layout, const OptimizerGroups& groups,
                                  size_t group) {
  std::vector<std::string> names;
  for (size_t i = 0; i < layout.specs().size(); ++i)
    if (!layout.specs()[i].is_buffer && groups.group_of(i) == group)
      names.push_back(layout.specs()[i].name);
  return names;
}

TEST(OptimizerGroups, MatchOlmoCoreAndHuggingFaceNames) {
  const ParamLayout layout = ParamLayout::build(grouped_config());
  OptimConfig oc;
  oc.group_overrides = {
      {{"blocks.*.routed_experts.w_up_gate"}, 2e-3, {}, 0.8, {}, {}},
      {{"model.layers.*.self_attn.[qk]_norm.weight", "embeddings.weight"}, {}, 0.0, {}, {}, 1e-6},
      {{"module.blocks.0.shared_experts.*"}, {}, {}, {}, {}, {}}};
  const OptimizerGroups groups(layout, oc, /*whole_model=*/true);
  ASSERT_EQ(groups.count(), 4u);
  // Every expert's gate and up projection (OLMo-core's one w_up_gate), not the down projections.
  EXPECT_EQ(names_in(layout, groups, 1),
            (std::vector<std::string>{"model.layers.1.mlp.experts.0.gate_proj.weight",
                                      "model.layers.1.mlp.experts.0.up_proj.weight",
                                      "model.layers.1.mlp.experts.1.gate_proj.weight",
                                      "model.layers.1.mlp.experts.1.up_proj.weight",
                                      "model.layers.1.mlp.experts.2.gate_proj.weight",
                                      "model.layers.1.mlp.experts.2.up_proj.weight",
                                      "model.layers.1.mlp.experts.3.gate_proj.weight",
                                      "model.layers.1.mlp.experts.3.up_proj.weight"}));
  EXPECT_EQ(names_in(layout, groups, 2),
            (std::vector<std::string>{
                "model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight",
                "model.layers.0.self_attn.k_norm.weight", "model.layers.1.self_attn.q_norm.weight",
                "model.layers.1.self_attn.k_norm.weight"}));
  // The dense first layer's MLP is OLMo-core's shared_experts of block 0, named here as OLMo-core's
  // OLMoDDP train module sees it (its data-parallel wrapper's "module." before every name).
  EXPECT_EQ(names_in(layout, groups, 3),
            (std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight",
                                      "model.layers.0.mlp.up_proj.weight",
                                      "model.layers.0.mlp.down_proj.weight"}));
  EXPECT_EQ(groups.settings(1).lr, 2e-3);
  EXPECT_EQ(groups.settings(1).beta1, 0.8);
  EXPECT_EQ(groups.settings(1).beta2, oc.beta2);
  EXPECT_EQ(groups.settings(2).lr, oc.lr);
  EXPECT_EQ(groups.settings(2).eps, 1e-6);
  // A weight_decay given by the override applies to the norms no_decay exempts (at its rate, 0
  // here); the rest keep no_decay's rule.
  for (size_t i = 0; i < layout.specs().size(); ++i) {
    const ParamSpec& spec = layout.specs()[i];
    if (spec.is_buffer) continue;
    const bool exempt = spec.is_norm || spec.is_embedding;
    EXPECT_EQ(groups.decays(i), groups.group_of(i) == 2 || !exempt) << spec.name;
  }
}

// OLMo-core's names of the norms by role, whatever the block layout and the QK-norm's form, and of
// a tied LM head (the embedding).
TEST(OptimizerGroups, OlmoCoreNamesOfEveryLayout) {
  ModelConfig c = grouped_config();
  c.block_norm = BlockNorm::kPre;
  c.qk_norm = QkNorm::kPerHead;
  c.tie_word_embeddings = true;
  const ParamLayout layout = ParamLayout::build(c);
  const std::vector<std::pair<const char*, const char*>> expected = {
      {"model.layers.0.input_layernorm.weight", "blocks.0.attention_norm.weight"},
      {"model.layers.0.post_attention_layernorm.weight", "blocks.0.feed_forward_norm.weight"},
      {"model.layers.1.self_attn.q_norm.weight", "blocks.1.attention.q_norm.weight"},
      {"model.layers.1.self_attn.o_proj.weight", "blocks.1.attention.w_out.weight"},
      {"model.layers.1.mlp.gate.weight", "blocks.1.routed_experts_router.weight"},
      {"model.layers.1.mlp.experts.2.down_proj.weight", "blocks.1.routed_experts.w_down"},
      {"model.layers.1.mlp.shared_expert.down_proj.weight", "blocks.1.shared_experts.w_down"},
      {"model.norm.weight", "lm_head.norm.weight"},
      {"model.embed_tokens.weight", "embeddings.weight"}};
  for (const auto& [name, olmo_core] : expected) {
    const ParamSpec* spec = layout.find(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->olmo_core_name, olmo_core) << name;
  }
  EXPECT_EQ(layout.find("lm_head.weight"), nullptr);  // tied: the embedding is the head
}

TEST(OptimizerGroups, RefusesAParameterInTwoGroupsAndAPatternMatchingNothing) {
  const ModelConfig mc = grouped_config();
  const ParamLayout layout = ParamLayout::build(mc);
  OptimConfig oc;
  oc.group_overrides = {{{"blocks.1.*"}, {}, {}, {}, {}, {}},
                        {{"model.layers.1.mlp.shared_expert.up_proj.weight"}, {}, {}, {}, {}, {}}};
  try {
    OptimizerGroups(layout, oc, true);
    FAIL() << "a tensor in two groups was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "optim.group_overrides[0] and optim.group_overrides[1] both name "
                  "model.layers.1.mlp.shared_expert.up_proj.weight (OLMo-core's "
                  "blocks.1.shared_experts.w_up_gate)"),
              std::string::npos)
        << e.what();
  }
  // The selection bias is a buffer, which no group holds (OLMo-core's score_bias is not a
  // parameter either); a misspelt name matches nothing.
  for (const char* pattern : {"blocks.1.routed_experts_router.score_bias", "blocks.*.atention.*"}) {
    oc.group_overrides = {{{pattern}, {}, {}, {}, {}, {}}};
    try {
      OptimizerGroups(layout, oc, true);
      FAIL() << pattern << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("matches no trained parameter"), std::string::npos)
          << e.what();
    }
  }
  // A rank's part of the model may hold none of an override's tensors: experts 2-3 of ep = 2's
  // second rank are not expert 0's.
  oc.group_overrides = {{{"model.layers.1.mlp.experts.0.*"}, 1e-4, {}, {}, {}, {}}};
  const ParamLayout second_rank = ParamLayout::build(mc, 2, 1);
  const OptimizerGroups part(second_rank, oc);
  EXPECT_TRUE(names_in(second_rank, part, 1).empty());
}

// One AdamW step of a run with overrides gives each group's tensors the bits of a run whose
// [optim] holds that group's values (its rate, betas, eps, weight decay).
TEST(OptimizerGroups, EachGroupUpdatesAsARunWithItsValues) {
  const ParamLayout layout = ParamLayout::build(grouped_config());
  OptimConfig base;
  base.lr = 1e-2;
  base.weight_decay = 0.1;
  OptimConfig grouped = base;
  grouped.group_overrides = {{{"blocks.*.routed_experts.*"}, 3e-3, 0.5, 0.8, 0.99, 1e-4},
                             {{"*_norm.weight"}, {}, 0.25, {}, {}, {}}};
  OptimConfig experts = base;
  experts.lr = 3e-3;
  experts.weight_decay = 0.5;
  experts.beta1 = 0.8;
  experts.beta2 = 0.99;
  experts.eps = 1e-4;
  OptimConfig norms = base;  // decayed although norms: no_decay = "none" shows it
  norms.weight_decay = 0.25;
  norms.no_decay = NoDecay::kNone;

  ParamBuffers start(layout), grads(layout);
  uint32_t seed = 1;
  for (const ParamSpec& spec : layout.specs()) {
    const std::vector<float> p = gradcheck::random_vec(spec.numel, seed++, -1.0f, 1.0f);
    const std::vector<float> g = gradcheck::random_vec(spec.numel, seed++, -1.0f, 1.0f);
    std::copy(p.begin(), p.end(), start.at(spec));
    std::copy(g.begin(), g.end(), grads.at(spec));
  }
  auto two_steps = [&](const OptimConfig& oc, const std::vector<double>& rates) {
    ParamBuffers params = start;
    AdamW opt(layout, oc);
    for (int step = 0; step < 2; ++step) {
      opt.stage_step(rates);
      opt.apply_step(params, grads);
    }
    return params;
  };
  const ParamBuffers ours = two_steps(grouped, {base.lr, 3e-3, base.lr});
  const ParamBuffers as_base = two_steps(base, {base.lr});
  const ParamBuffers as_experts = two_steps(experts, {experts.lr});
  const ParamBuffers as_norms = two_steps(norms, {norms.lr});
  const OptimizerGroups groups(layout, grouped);
  for (size_t i = 0; i < layout.specs().size(); ++i) {
    const ParamSpec& spec = layout.specs()[i];
    if (spec.is_buffer) continue;
    const size_t g = groups.group_of(i);
    const ParamBuffers& expected = g == 1 ? as_experts : g == 2 ? as_norms : as_base;
    EXPECT_EQ(std::memcmp(ours.at(spec), expected.at(spec), spec.numel * sizeof(float)), 0)
        << spec.name << " (group " << g << ")";
    // And the groups' values mattered: the tensor moved otherwise than under [optim]'s.
    if (g != 0) {
      EXPECT_NE(std::memcmp(ours.at(spec), as_base.at(spec), spec.numel * sizeof(float)), 0)
          << spec.name;
    }
  }
}

}  // namespace
}  // namespace moecore
