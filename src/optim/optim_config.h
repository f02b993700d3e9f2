// Optimizer settings: the [optim] table of a config file.
#pragma once

#include <cmath>
#include <cstdint>

namespace moecore {

// OLMo-core's schedulers (optim/lr_schedule.h): CosWithWarmup, LinearWithWarmup,
// ConstantWithWarmup, WSD, InvSqrtWithWarmup, HalfCosWithWarmup, CosWithWarmupAndLinearDecay,
// PowerLR.
enum class LrSchedule {
  kCosine,
  kLinear,
  kConstant,
  kWsd,
  kInvSqrt,
  kHalfCosine,
  kCosineLinearDecay,
  kPower
};

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
  // The linear decay tail of "wsd", "cosine_linear_decay" and "power": decay_steps updates when
  // > 0, else round(max_steps * decay_fraction).
  int64_t decay_steps = 0;
  double decay_fraction = 0.1;
  // "cosine_linear_decay": the tail falls from the cosine's rate to lr * decay_min_lr_ratio
  // (OLMo-core's decay_min_lr, 0 by default); min_lr_ratio stays the cosine's floor (alpha_f).
  double decay_min_lr_ratio = 0.0;
  // "power": lr (t / warm-up)^power_exponent after the warm-up (OLMo-core's PowerLR b < 0).
  double power_exponent = -0.51;

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

// The decay tail's length in updates (wsd, cosine_linear_decay, power): decay_steps when > 0,
// else round(total_steps * decay_fraction).
inline int64_t decay_updates(const OptimConfig& c, int64_t total_steps) {
  return c.decay_steps > 0 ? c.decay_steps : round_half_even(total_steps, c.decay_fraction);
}

// Whether the schedule ends in a linear decay tail of decay_updates updates.
inline bool has_decay_tail(LrSchedule s) {
  return s == LrSchedule::kWsd || s == LrSchedule::kCosineLinearDecay || s == LrSchedule::kPower;
}

}  // namespace moecore
