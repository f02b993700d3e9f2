// One training pass of a model (forward and backward) over a fixed batch of two 8-token
// sequences of the tiny models' 13-token vocabulary (one ignored target), and the refresh
// protocol of the weight copies built on it (test_bf16_weight_copies.cpp, test_mxfp8_experts.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/ignore_index.h"
#include "model/params.h"
#include "model/precision_recipe.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"

namespace moecore {

inline const std::vector<int32_t> kTinyTokens = {1, 5, 9, 5, 0, 3, 10, 7, 12, 2, 4, 4, 8, 11, 6, 1};
inline const std::vector<int32_t> kTinyTargets = {5, 9, kIgnoreIndex, 2, 3, 10, 7, 4, 1, 0,
                                                  4, 8, 11,           6, 1, 9};

struct TinyPass {
  double loss;
  std::vector<float> dense_grads;
  std::vector<float> expert_grads;
};

inline TinyPass tiny_pass(Transformer& model, const ParamLayout& layout,
                          const ParamBuffers& params) {
  ParamBuffers grads(layout);
  const LossParts loss = model.forward(params, kTinyTokens.data(), kTinyTargets.data(), 2, 8);
  model.backward(params, grads, 1.0f);
  return {loss.total, host_copy(grads.dense), host_copy(grads.expert)};
}

// The weight copies of `recipe` (bf16 copies, MX caches) are remade at every forward by default,
// and with WeightCopyRefresh::kOnWeightsChanged only after weights_changed(): a pass after the
// weights moved (every weight times `factor`, more than one rounding step of the copies' format)
// reads stale copies until the mark, which shows that the GEMMs read the copies rather than the
// fp32 weights; after it, both modes give the same pass.
inline void expect_copies_remade_only_when_told(const ModelConfig& c, const PrecisionRecipe& recipe,
                                                uint32_t seed, float factor) {
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  fill_tiny_params(layout, seed, params);
  Transformer every_forward(c, layout), on_change(c, layout);
  every_forward.set_precision(recipe);
  on_change.set_precision(recipe);
  on_change.set_weight_copy_refresh(Transformer::WeightCopyRefresh::kOnWeightsChanged);

  const TinyPass before = tiny_pass(every_forward, layout, params);
  const TinyPass before_on_change = tiny_pass(on_change, layout, params);
  EXPECT_EQ(before_on_change.loss, before.loss);
  EXPECT_EQ(before_on_change.dense_grads, before.dense_grads);
  EXPECT_EQ(before_on_change.expert_grads, before.expert_grads);

  for (float& w : params.dense.span()) w *= factor;  // an optimizer step's worth of change
  for (float& w : params.expert.span()) w *= factor;
  const TinyPass after = tiny_pass(every_forward, layout, params);
  ASSERT_NE(after.loss, before.loss);
  const TinyPass stale = tiny_pass(on_change, layout, params);
  // Only the fp32 parts (router, norms, embedding) see the change; the copied weights do not.
  EXPECT_NE(stale.loss, after.loss);

  on_change.weights_changed();
  const TinyPass fresh = tiny_pass(on_change, layout, params);
  EXPECT_EQ(fresh.loss, after.loss);
  EXPECT_EQ(fresh.dense_grads, after.dense_grads);
  EXPECT_EQ(fresh.expert_grads, after.expert_grads);
}

}  // namespace moecore
