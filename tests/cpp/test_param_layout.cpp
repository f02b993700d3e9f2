// ParamLayout's per-layer lookups (layer_specs, layer_range) search only the layer's own tensors;
// here they are held against the definitions by name over the whole table, for whole models, a
// rank's experts and pipeline chunks that skip layers, and check_placement against build().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "model/params.h"
#include "tiny_moe_config.h"

namespace moecore {
namespace {

// layer_range's definition: the span of the layer's tensors of `group`, found by name prefix.
std::pair<size_t, size_t> range_by_prefix(const ParamLayout& layout, ParamGroup group,
                                          int64_t layer) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  size_t begin = SIZE_MAX, end = 0;
  for (const ParamSpec& spec : layout.specs()) {
    if (spec.group != group || spec.name.rfind(prefix, 0) != 0) continue;
    begin = std::min(begin, spec.offset);
    end = std::max(end, spec.offset + spec.numel);
  }
  return begin == SIZE_MAX ? std::pair<size_t, size_t>{0, 0} : std::pair{begin, end};
}

void expect_lookups_match_names(const ModelConfig& c, const ParamLayout& layout) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string e = p + "mlp.experts." + std::to_string(layout.first_local_expert()) + ".";
    const LayerSpecs s = layout.layer_specs(i);
    const std::pair<const ParamSpec*, std::string> fields[] = {
        {s.input_norm, p + "input_layernorm.weight"},
        {s.q_proj, p + "self_attn.q_proj.weight"},
        {s.k_proj, p + "self_attn.k_proj.weight"},
        {s.v_proj, p + "self_attn.v_proj.weight"},
        {s.o_proj, p + "self_attn.o_proj.weight"},
        {s.q_norm, p + "self_attn.q_norm.weight"},
        {s.k_norm, p + "self_attn.k_norm.weight"},
        {s.post_norm, p + "post_attention_layernorm.weight"},
        {s.mlp_gate, p + "mlp.gate_proj.weight"},
        {s.mlp_down, p + "mlp.down_proj.weight"},
        {s.router, p + "mlp.gate.weight"},
        {s.router_bias, p + "mlp.gate.e_score_correction_bias"},
        {s.expert_gate, e + "gate_proj.weight"},
        {s.expert_down, e + "down_proj.weight"},
        {s.shared_gate, p + "mlp.shared_expert.gate_proj.weight"},
        {s.shared_down, p + "mlp.shared_expert.down_proj.weight"}};
    for (const auto& [found, name] : fields) EXPECT_EQ(found, layout.find(name)) << name;
    for (const ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert})
      EXPECT_EQ(layout.layer_range(group, i), range_by_prefix(layout, group, i)) << p;
  }
}

TEST(ParamLayoutLookups, LayerSpecsAndRangesMatchTheNamesEverywhere) {
  ModelConfig c = tiny_moe_config(5);  // layer 0 dense, layers 1-4 MoE with a shared expert
  c.tie_word_embeddings = false;
  const ParamLayout whole = ParamLayout::build(c);
  expect_lookups_match_names(c, whole);
  EXPECT_NE(whole.layer_specs(0).mlp_gate, nullptr);
  EXPECT_NE(whole.layer_specs(3).expert_gate, nullptr);
  // The second of two expert-parallel ranks, and a pipeline stage holding layers 1 and 3-4 only.
  expect_lookups_match_names(c, ParamLayout::build(c, 2, 1));
  const ParamLayout chunked = ParamLayout::build(c, 2, 0, {{1, 2}, {3, -1}});
  expect_lookups_match_names(c, chunked);
  EXPECT_EQ(chunked.layer_specs(2).q_proj, nullptr);  // not held: every field empty
  EXPECT_EQ(chunked.layer_range(ParamGroup::kDense, 2), (std::pair<size_t, size_t>{0, 0}));
  EXPECT_EQ(chunked.layer_specs(7).q_proj, nullptr);  // past the model
}

TEST(ParamLayoutLookups, CheckPlacementRefusesWhatBuildRefuses) {
  ModelConfig c = tiny_moe_config(4);
  EXPECT_THROW(ParamLayout::check_placement(c, 3), Error);  // 3 does not divide 4 experts
  EXPECT_THROW((void)ParamLayout::build(c, 3), Error);
  c.tie_word_embeddings = true;  // the embedding on stage 0, the head on stage 1
  EXPECT_THROW(ParamLayout::check_placement(c, 1, 0, {{0, 2}}), Error);
  EXPECT_THROW((void)ParamLayout::build(c, 1, 0, {{0, 2}}), Error);
  EXPECT_NO_THROW(ParamLayout::check_placement(c, 2, 1, {}));
}

}  // namespace
}  // namespace moecore
