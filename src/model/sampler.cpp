#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "model/inference.h"

namespace moecore {

namespace {

void check_logits(const std::vector<float>& logits) {
  MOE_CHECK(!logits.empty(), "[sampler] empty logits");
  for (size_t i = 0; i < logits.size(); ++i)
    MOE_CHECK(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(),
              "[sampler] logit of token {} is {}", i, logits[i]);
}

}  // namespace

int32_t argmax(const std::vector<float>& logits) {
  check_logits(logits);
  // max_element returns the first of equal maxima: ties go to the lowest id.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingConfig& config) : config_(config), rng_(config.seed) {
  MOE_CHECK(std::isfinite(config.temperature) && config.temperature >= 0.0,
            "[sampler] temperature={} must be finite and >= 0", config.temperature);
  MOE_CHECK(config.top_k >= 0, "[sampler] top_k={} must be >= 0 (0 disables it)", config.top_k);
  MOE_CHECK(config.top_p > 0.0 && config.top_p <= 1.0,
            "[sampler] top_p={} must be in (0, 1] (1 disables it)", config.top_p);
}

void Sampler::filter(const std::vector<float>& logits, std::vector<int32_t>& ids,
                     std::vector<double>& probs) const {
  check_logits(logits);
  const auto logit = [&logits](int32_t id) { return logits[static_cast<size_t>(id)]; };
  const int64_t vocab = static_cast<int64_t>(logits.size());
  ids.resize(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = config_.top_k > 0 ? std::min(config_.top_k, vocab) : vocab;
  if (k < vocab) {
    // TopKLogitsWarper: every token whose logit reaches the k-th largest stays, so tokens tied
    // with it all do (k is a floor, not a count). Dividing by the temperature keeps the order.
    std::vector<float> sorted(logits);
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
    const float kth = sorted[static_cast<size_t>(k - 1)];
    std::erase_if(ids, [&](int32_t id) { return logit(id) < kth; });
  }

  // Softmax of logits / temperature over the kept tokens, in double. The largest logit is taken
  // off before dividing: with a tiny (subnormal) temperature the quotient of the others is -inf
  // rather than inf - inf, so the distribution is its limit, the argmax (ties shared).
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t id : ids) max_logit = std::max(max_logit, logit(id));
  MOE_CHECK(max_logit > -std::numeric_limits<float>::infinity(),
            "[sampler] every candidate logit is -inf");
  probs.resize(ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double shifted = static_cast<double>(logit(ids[i])) - static_cast<double>(max_logit);
    probs[i] = std::exp(shifted / config_.temperature);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;

  if (config_.top_p < 1.0) {
    // TopPLogitsWarper: tokens in ascending order of logit (a stable sort: tied ones by id) are
    // dropped while the probability accumulated up to and including them stays <= 1 - top_p;
    // the most likely token always stays.
    std::vector<size_t> ascending(ids.size());
    std::iota(ascending.begin(), ascending.end(), 0);
    std::stable_sort(ascending.begin(), ascending.end(),
                     [&](size_t a, size_t b) { return logit(ids[a]) < logit(ids[b]); });
    std::vector<bool> dropped(ids.size(), false);
    double cumulative = 0.0;
    for (size_t j = 0; j + 1 < ascending.size(); ++j) {
      cumulative += probs[ascending[j]];
      if (cumulative > 1.0 - config_.top_p) break;
      dropped[ascending[j]] = true;
    }
    size_t kept = 0;
    double kept_sum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (dropped[i]) continue;
      ids[kept] = ids[i];
      probs[kept] = probs[i];
      kept_sum += probs[i];
      ++kept;
    }
    ids.resize(kept);
    probs.resize(kept);
    for (double& p : probs) p /= kept_sum;
  }
}

int32_t Sampler::sample(const std::vector<float>& logits) {
  if (config_.temperature == 0.0) return argmax(logits);
  filter(logits, ids_, probs_);
  const double u = rng_.next_double();
  double cumulative = 0.0;
  for (size_t i = 0; i < probs_.size(); ++i) {
    cumulative += probs_[i];
    if (u < cumulative && probs_[i] > 0.0) return ids_[i];
  }
  // Rounding left the total just under u: take the last token with non-zero probability.
  for (size_t i = probs_.size(); i-- > 0;)
    if (probs_[i] > 0.0) return ids_[i];
  return ids_.front();  // unreachable: the max candidate has probability > 0
}

std::vector<double> Sampler::probabilities(const std::vector<float>& logits) const {
  std::vector<double> out(logits.size(), 0.0);
  if (config_.temperature == 0.0) {
    out[static_cast<size_t>(argmax(logits))] = 1.0;
    return out;
  }
  std::vector<int32_t> ids;
  std::vector<double> probs;
  filter(logits, ids, probs);
  for (size_t i = 0; i < ids.size(); ++i) out[static_cast<size_t>(ids[i])] = probs[i];
  return out;
}

std::vector<int32_t> generate(InferenceModel& model, const std::vector<int32_t>& prompt,
                              int64_t max_tokens, const SamplingConfig& config,
                              const std::vector<int32_t>& stop_tokens, int64_t drawable) {
  MOE_CHECK(!prompt.empty(), "[generate] the prompt is empty");
  MOE_CHECK(max_tokens >= 0, "[generate] max_tokens={} must be >= 0", max_tokens);
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t needed = prompt_len + std::max<int64_t>(max_tokens - 1, 0);
  MOE_CHECK(needed <= model.max_seq(),
            "[generate] prompt of {} tokens + max_tokens={} needs {} positions, max_seq={}",
            prompt_len, max_tokens, needed, model.max_seq());
  Sampler sampler(config);
  model.reset();
  std::vector<int32_t> out;
  if (max_tokens == 0) return out;
  out.reserve(static_cast<size_t>(max_tokens));
  std::vector<float> drawn;  // the drawable ids' logits, when not all are
  const auto draw = [&](const std::vector<float>& logits) {
    if (drawable <= 0 || drawable >= static_cast<int64_t>(logits.size()))
      return sampler.sample(logits);
    drawn.assign(logits.begin(), logits.begin() + drawable);
    return sampler.sample(drawn);
  };
  const std::vector<float>* logits = &model.prefill(prompt);
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t token = draw(*logits);
    out.push_back(token);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) break;
    if (i + 1 < max_tokens) logits = &model.decode_step(token);
  }
  return out;
}

}  // namespace moecore
