// One training pass of a model (forward and backward) over a fixed batch of two 8-token
// sequences of the tiny models' 13-token vocabulary (one ignored target): what the weight-copy
// tests compare between refresh modes (test_bf16_weight_copies.cpp, test_mxfp8_experts.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/ignore_index.h"
#include "model/params.h"
#include "model/transformer.h"

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
  return {loss.total, grads.dense, grads.expert};
}

}  // namespace moecore
