// The bf16 weight copies (model/bf16_weight_copies.h): which weights a bf16 recipe copies, that the
// GEMMs read the copies rather than converting the fp32 weights per call, and when the copies are
// remade (every forward by default; only after weights_changed() for the trainer).
#include <gtest/gtest.h>

#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/ignore_index.h"
#include "model/bf16_weight_copies.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"
#include "tiny_moe_pass.h"

namespace moecore {
namespace {

using Precision = kernels::MatmulPrecision;

TEST(Bf16WeightCopies, ABf16RecipeCopiesEveryGemmWeightButTheRouters) {
  const ModelConfig c = tiny_moe_config(3);  // a dense first layer, then two MoE layers
  const ParamLayout layout = ParamLayout::build(c);
  Transformer model(c, layout);
  EXPECT_EQ(model.bf16_weight_copies().numel(), 0u) << "fp32: nothing to copy";
  model.set_precision(PrecisionRecipe::from_train_precision(Precision::kBf16));
  const int64_t d = c.hidden_size;
  const int64_t attention = (2 * c.q_size() + 2 * c.kv_size()) * d;
  const int64_t dense_mlp = 3 * c.intermediate_size * d;
  const int64_t moe = c.num_experts * 3 * c.moe_intermediate_size * d +
                      3 * c.shared_expert_intermediate_size * d;  // the router is not copied
  const int64_t head = c.vocab_size * d;
  EXPECT_EQ(model.bf16_weight_copies().numel(),
            static_cast<size_t>(3 * attention + dense_mlp + 2 * moe + head));
  PrecisionRecipe experts_only;
  experts_only.experts = Precision::kBf16;
  model.set_precision(experts_only);
  EXPECT_EQ(model.bf16_weight_copies().numel(),
            static_cast<size_t>(2 * c.num_experts * 3 * c.moe_intermediate_size * d));
}

// The default refreshes at every forward; the trainer's mode reads the same copies until told
// that the weights changed (tiny_moe_pass.h). A factor of 1.05 moves every weight by more than a
// bf16 ulp.
TEST(Bf16WeightCopies, RemadeAtEveryForwardOrOnlyAfterWeightsChanged) {
  expect_copies_remade_only_when_told(
      tiny_moe_config(3), PrecisionRecipe::from_train_precision(Precision::kBf16), 5, 1.05f);
}

TEST(Bf16WeightCopies, FindsCoveredRangesOnly) {
  std::vector<float> dense(10), expert(6);
  for (size_t i = 0; i < dense.size(); ++i) dense[i] = 1.0f + static_cast<float>(i);
  const ModelConfig c = tiny_moe_config(1);
  ParamBuffers params(ParamLayout::build(c));
  params.dense = device_copy(dense);
  params.expert = device_copy(expert);
  Bf16WeightCopies copies({{ParamGroup::kDense, 2, 4}, {ParamGroup::kExpert, 0, 6}});
  EXPECT_EQ(copies.numel(), 10u);
  copies.refresh(params);
  const uint16_t* inner = copies.find(ParamGroup::kDense, 3, 2);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(bf16_to_float(inner[0]), 4.0f);  // element 3 of the dense buffer
  EXPECT_EQ(copies.find(ParamGroup::kDense, 5, 2), nullptr) << "runs past the range";
  EXPECT_EQ(copies.find(ParamGroup::kDense, 0, 1), nullptr);
  EXPECT_NE(copies.find(ParamGroup::kExpert, 0, 6), nullptr);
  EXPECT_THROW(Bf16WeightCopies({{ParamGroup::kDense, 0, 4}, {ParamGroup::kDense, 3, 2}}), Error);
}

}  // namespace
}  // namespace moecore
