// Optimizer settings: the [optim] table of a config file.
#pragma once

#include <cmath>
#include <cstdint>

namespace moecore {

enum class LrSchedule { kCosine, kLinear, kConstant, kWsd, kInvSqrt };

// The parameters AdamW's weight decay leaves alone: norm gains and embeddings (moecore's default),
// the input embedding only (OLMo-core's recipes: their group override exempts embeddings.weight;
// a tied LM head is that tensor), or none (OLMo-core's AdamW without group overrides).
enum class NoDecay { kNormsAndEmbeddings, kEmbeddings, kNone };

struct OptimConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // not applied to the parameters no_decay names
  NoDecay no_decay = NoDecay::kNormsAndEmbeddings;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  int64_t warmup_steps = 0;
  // > 0: the warm-up is round(max_steps * warmup_fraction) updates (ties to even, as Python's
  // round in OLMo-core's schedulers) instead of warmup_steps, which must then be 0.
  double warmup_fraction = 0.0;
  LrSchedule schedule = LrSchedule::kCosine;
  double min_lr_ratio = 0.1;  // the schedule ends at lr * min_lr_ratio
  // "wsd" (OLMo-core's WSD): the linear decay's length, decay_steps updates when > 0, else
  // round(max_steps * decay_fraction).
  int64_t decay_steps = 0;
  double decay_fraction = 0.1;

  void validate() const;
};

// Python's round(total * fraction), which OLMo-core's schedulers use: the nearest integer, ties to
// even (the default rounding mode, which nearbyint follows).
inline int64_t round_half_even(int64_t total, double fraction) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(total) * fraction));
}

// The warm-up's length in updates of a run of total_steps: warmup_steps, or round(total_steps *
// warmup_fraction).
inline int64_t warmup_updates(const OptimConfig& c, int64_t total_steps) {
  return c.warmup_fraction > 0.0 ? round_half_even(total_steps, c.warmup_fraction) : c.warmup_steps;
}

// The WSD decay's length in updates: decay_steps when > 0, else round(total_steps *
// decay_fraction).
inline int64_t wsd_decay_updates(const OptimConfig& c, int64_t total_steps) {
  return c.decay_steps > 0 ? c.decay_steps : round_half_even(total_steps, c.decay_fraction);
}

}  // namespace moecore
