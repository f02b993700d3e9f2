// A sigmoid router's scores are sigmoid(logit) + this, in fp32, as OLMo-core's v2 router's
// (sigmoid_stability_epsilon, 1e-7 by default): a token whose logits are all very negative still
// has scores with a non-zero sum, which the load-balancing probabilities and norm_topk_prob divide
// by (without it both were 0 / 0). One header for every backend, the CUDA kernels' included.
#pragma once

namespace moecore::kernels {

inline constexpr float kSigmoidScoreEpsilon = 1e-7f;

}  // namespace moecore::kernels
