// Token sampling for generation: temperature, top-k, top-p (nucleus), with a portable RNG so a seed
// gives the same tokens on every platform and standard library (std::*_distribution does not).
//
// For temperature > 0 the distribution is that of Hugging Face's logits warpers, in their order
// (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper with min_tokens_to_keep 1):
//   logits / temperature -> top_k keeps every token whose logit reaches the k-th largest (0: all;
//   ties at the boundary all stay) -> softmax over the kept tokens -> top_p drops the least likely
//   tokens, in ascending order of logit with ties by id, while their cumulative probability stays
//   <= 1 - top_p, the most likely always staying -> renormalise -> draw u ~ U[0, 1) and invert
//   the CDF over the kept tokens in id order. (transformers orders the tokens with torch.sort,
//   which is not stable: on a short vocabulary its ties come in id order as here, on a long one
//   it may drop other tokens of a tie that straddles the cut, the same number of them.)
// temperature == 0 is greedy: the argmax, ties to the lowest id; top_k/top_p/seed are then
// irrelevant. Logits of -inf are masked tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/splitmix64.h"

namespace moecore {

class InferenceModel;

struct SamplingConfig {
  double temperature = 1.0;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // >= 0; 0 = no top-k filter
  double top_p = 1.0;        // in (0, 1]; 1 = no nucleus filter
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws moecore::Error for temperature < 0 (or not finite), top_k < 0, or top_p outside (0, 1].
  explicit Sampler(const SamplingConfig& config);

  // One token id from logits [vocab]; advances the RNG by exactly one draw unless greedy. Throws
  // moecore::Error for empty logits, a NaN or +inf logit, or logits that are all -inf.
  int32_t sample(const std::vector<float>& logits);

  // The distribution sample() draws from, after temperature, top-k and top-p: [vocab], zeros for
  // filtered tokens, one-hot for greedy. For tests and diagnostics.
  std::vector<double> probabilities(const std::vector<float>& logits) const;

  const SamplingConfig& config() const { return config_; }

 private:
  // Kept token ids, in id order, and their normalised probabilities.
  void filter(const std::vector<float>& logits, std::vector<int32_t>& ids,
              std::vector<double>& probs) const;

  SamplingConfig config_;
  SplitMix64 rng_;
  std::vector<int32_t> ids_;  // scratch of sample(), reused across calls
  std::vector<double> probs_;
};

// Index of the largest logit, ties to the lowest id. Throws on empty logits or a NaN.
int32_t argmax(const std::vector<float>& logits);

// Starts a new sequence (model.reset()), prefills the prompt, then samples up to max_tokens new
// tokens with a Sampler(config). Returns the generated tokens only (not the prompt). Generation
// stops after emitting any of stop_tokens, which is included as the last element (as Hugging
// Face's generate keeps the EOS; a model may name several EOS ids). Throws moecore::Error, before
// any work, for an empty prompt, max_tokens < 0, or prompt.size() + max_tokens - 1 >
// model.max_seq() (the last sampled token is never fed back, so it needs no cache slot). drawable >
// 0: only ids below it are drawn (a tokenizer smaller than the model's padded vocabulary has no
// text for the others).
std::vector<int32_t> generate(InferenceModel& model, const std::vector<int32_t>& prompt,
                              int64_t max_tokens, const SamplingConfig& config,
                              const std::vector<int32_t>& stop_tokens = {}, int64_t drawable = 0);

}  // namespace moecore
