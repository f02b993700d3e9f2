// Optimizer settings: the [optim] table of a config file.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moecore {

// OLMo-core's schedulers (optim/lr_schedule.h): CosWithWarmup, LinearWithWarmup,
// ConstantWithWarmup, WSD, InvSqrtWithWarmup, HalfCosWithWarmup, CosWithWarmupAndLinearDecay,
// PowerLR, WSDS, ExponentialScheduler, ComposableScheduler, SequentialScheduler.
enum class LrSchedule {
  kCosine,
  kLinear,
  kConstant,
  kWsd,
  kInvSqrt,
  kHalfCosine,
  kCosineLinearDecay,
  kPower,
  kWsds,
  kExponential,
  kComposable,
  kSequential
};

// How a stage of "composable" goes from its start rate to its end rate (OLMo-core's
// ComposableSchedulerStageType): a straight line, or half a cosine.
enum class LrShape { kLinear, kCosine };

// A stage of "composable" (OLMo-core's ComposableSchedulerStage): `duration` units (updates, or
// tokens under units "tokens") from its start rate (start_lr, or lr x start_lr_fraction; neither:
// where the stage before ended, lr for the first) to its end rate (end_lr or lr x
// end_lr_fraction, exactly one).
struct LrStage {
  int64_t duration = 0;
  LrShape shape = LrShape::kLinear;
  std::optional<double> start_lr, start_lr_fraction, end_lr, end_lr_fraction;
  bool operator==(const LrStage&) const = default;
};

// OLMo-core's OverrideDecay: from position `start` on, the stages give way to a decay over
// `duration` units from the rate they give at `start` to end_lr (or lr x end_lr_fraction), held
// after it (an anneal from the middle of a run).
struct LrOverrideDecay {
  int64_t start = 0;
  int64_t duration = 0;
  LrShape shape = LrShape::kLinear;
  std::optional<double> end_lr, end_lr_fraction;
  bool operator==(const LrOverrideDecay&) const = default;
};

// What a schedule counts (OLMo-core's SchedulerUnits): updates, or tokens seen (an update of the
// run adds train.batch_size x train.seq_len tokens; the schedule's t_max is max_steps of them).
enum class LrUnits { kSteps, kTokens };

// The parameters AdamW's weight decay leaves alone: norm gains and embeddings (moecore's default),
// the input embedding only (OLMo-core's recipes: their group override exempts embeddings.weight;
// a tied LM head is that tensor), or none (OLMo-core's AdamW without group overrides).
enum class NoDecay { kNormsAndEmbeddings, kEmbeddings, kNone };

// OLMo-core's OptimGroupOverride: the trained tensors whose name matches one of `params` (globs as
// Python's fnmatch reads them: *, ?, [seq], [!seq]; matched against moecore's Hugging Face name
// and against the name of the tensor that holds it in OLMo-core's OLMoDDP model) form an optimizer
// group of their own, trained with the values given here in place of [optim]'s. The group's lr is
// the initial_lr its schedule scales, as OLMo-core's schedulers scale each group's.
struct OptimGroupOverride {
  std::vector<std::string> params;
  std::optional<double> lr, weight_decay, beta1, beta2, eps;
  bool operator==(const OptimGroupOverride&) const = default;
};

struct OptimConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // not applied to the parameters no_decay names
  NoDecay no_decay = NoDecay::kNormsAndEmbeddings;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  LrUnits units = LrUnits::kSteps;
  int64_t warmup_steps = 0;   // units "steps"
  int64_t warmup_tokens = 0;  // units "tokens"
  // The rate the warm-up rises from (OLMo-core's warmup_min_lr, absolute, 0 by default): update t
  // of a warm-up of w trains at warmup_min_lr + (peak - warmup_min_lr) t / w.
  double warmup_min_lr = 0.0;
  // > 0: the warm-up is round(horizon * warmup_fraction) (ties to even, as Python's round in
  // OLMo-core's schedulers; the horizon: max_steps, or t_max, in the schedule's units) instead of
  // warmup_steps / warmup_tokens, which must then be 0.
  double warmup_fraction = 0.0;
  LrSchedule schedule = LrSchedule::kCosine;
  double min_lr_ratio = 0.1;  // the schedule ends at lr * min_lr_ratio
  // The linear decay tail of "wsd", "cosine_linear_decay" and "power": decay_steps updates
  // (decay_tokens tokens) when > 0, else round(the run's length in the units * decay_fraction).
  int64_t decay_steps = 0;
  int64_t decay_tokens = 0;  // units "tokens": the tail's length in tokens
  double decay_fraction = 0.1;
  // "cosine_linear_decay": the tail falls from the cosine's rate to lr * decay_min_lr_ratio
  // (OLMo-core's decay_min_lr, 0 by default); min_lr_ratio stays the cosine's floor (alpha_f).
  double decay_min_lr_ratio = 0.0;
  // "power": lr (t / warm-up)^power_exponent after the warm-up (OLMo-core's PowerLR b < 0).
  double power_exponent = -0.51;
  // > 0: the length of the cosine, linear and half_cos schedules (and cosine_linear_decay's
  // cosine) instead of the run's, after which they stay at lr * min_lr_ratio (OLMo-core's t_max:
  // a run that stops before its schedule ends, or goes on at the floor): in updates (units
  // "steps") or in tokens (units "tokens").
  int64_t t_max_steps = 0;
  int64_t t_max_tokens = 0;
  // "wsds" (OLMo-core's WSDS, warmup-stable-decay-simplified): consecutive periods of these
  // lengths (period_steps in updates, period_tokens in tokens), each at its peak lr x
  // period_lr_multipliers[i] (none: lr) until its last decay_length(period) units, which fall
  // linearly to lr x min_lr_ratio; the warm-up (warmup_steps / warmup_tokens, or warmup_fraction
  // of the first period) is the first period's start; after the last period, lr x min_lr_ratio.
  // Its length is its own, not the run's.
  std::vector<int64_t> period_steps;
  std::vector<int64_t> period_tokens;
  std::vector<double> period_lr_multipliers;
  // "exponential" (OLMo-core's ExponentialScheduler, a learning-rate range test): lr_min x (lr /
  // lr_min)^(t / horizon), from exponential_lr_min (its lr_min) to lr at the run's end.
  double exponential_lr_min = 1e-9;
  // "composable" (OLMo-core's ComposableScheduler): the stages one after the other, absolute
  // positions (its own length, not the run's; no warm-up but a stage's), the last stage's end
  // rate after them; override_decay, when set, takes over from its start.
  std::vector<LrStage> stages;
  std::optional<LrOverrideDecay> override_decay;
  // "sequential" (OLMo-core's SequentialScheduler): these schedules one after the other, each
  // running sequence_max units (the last to the run's end) over a horizon of min(the run's
  // remaining length, its sequence_max), from the rate the one before ended at (its initial_lr);
  // override_decay, when set, takes over from its start. Each entry holds a schedule's own keys
  // (lr and units are this config's; no entry is itself "sequential").
  std::vector<OptimConfig> sequence;
  int64_t sequence_max = 0;  // an entry's OLMo-core schedulers_max (none for the last)
  // OLMo-core's group_overrides: group k + 1 of the optimizer is group_overrides[k]'s tensors,
  // group 0 every other (optim/optimizer_groups.h). A tensor it names takes its weight_decay where
  // it gives one, no_decay's rule otherwise.
  std::vector<OptimGroupOverride> group_overrides;
  // OLMo-core's reset_optimizer_moments_on_load: a resume starts the Adam moments from zero (the
  // step count, and with it the bias correction, goes on from the checkpoint's), at the resume
  // that turns this on (the checkpoint's config had it off; later resumes of the run read their
  // moments as any resume does).
  bool reset_optimizer_moments_on_load = false;
  // An entry of a sequence: its rate checks that need its initial_lr (where the schedule before
  // it ended) or the positions the run asks it at are made over the run (validate_lr_schedule),
  // not alone.
  bool sequence_entry = false;

  void validate() const;
};

// Python's round(total * fraction), which OLMo-core's schedulers use: the nearest integer, ties to
// even (the default rounding mode, which nearbyint follows).
inline int64_t round_half_even(int64_t total, double fraction) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(total) * fraction));
}

// A schedule's lengths are in its units (updates or tokens); horizon: the run's length in them
// (max_steps, or max_steps x tokens per update).
// The warm-up's length: warmup_steps (warmup_tokens), or round(horizon * warmup_fraction).
inline int64_t warmup_length(const OptimConfig& c, int64_t horizon) {
  if (c.warmup_fraction > 0.0) return round_half_even(horizon, c.warmup_fraction);
  return c.units == LrUnits::kTokens ? c.warmup_tokens : c.warmup_steps;
}

// The decay tail's length (wsd, cosine_linear_decay, power): decay_steps (decay_tokens) when
// > 0, else round(horizon * decay_fraction).
inline int64_t decay_length(const OptimConfig& c, int64_t horizon) {
  const int64_t given = c.units == LrUnits::kTokens ? c.decay_tokens : c.decay_steps;
  return given > 0 ? given : round_half_even(horizon, c.decay_fraction);
}

// The schedule's horizon and an update's length in its units: 1 per update, or its tokens.
inline int64_t schedule_unit(const OptimConfig& c, int64_t tokens_per_step) {
  return c.units == LrUnits::kTokens ? tokens_per_step : 1;
}

// Whether the schedule has OLMo-core's t_max (CosWithWarmup, LinearWithWarmup,
// HalfCosWithWarmup, and CosWithWarmupAndLinearDecay's cosine).
inline bool has_t_max(LrSchedule s) {
  return s == LrSchedule::kCosine || s == LrSchedule::kLinear || s == LrSchedule::kHalfCosine ||
         s == LrSchedule::kCosineLinearDecay;
}

// The t_max of the schedule's units (0: none).
inline int64_t t_max_length(const OptimConfig& c) {
  return c.units == LrUnits::kTokens ? c.t_max_tokens : c.t_max_steps;
}

// The horizon a schedule with t_max runs over: t_max when set, else the run's.
inline int64_t own_horizon(const OptimConfig& c, int64_t run_horizon) {
  return has_t_max(c.schedule) && t_max_length(c) > 0 ? t_max_length(c) : run_horizon;
}

// The periods of "wsds" in the schedule's units.
inline const std::vector<int64_t>& period_lengths(const OptimConfig& c) {
  return c.units == LrUnits::kTokens ? c.period_tokens : c.period_steps;
}

// Whether the schedule has a warm-up of its own (ExponentialScheduler, ComposableScheduler and
// SequentialScheduler have none: a composable's first stage may be one, as may a sequence's
// first schedule).
inline bool has_warmup(LrSchedule s) {
  return s != LrSchedule::kExponential && s != LrSchedule::kComposable &&
         s != LrSchedule::kSequential;
}

// Whether the schedule ends in a linear decay tail of decay_length.
inline bool has_decay_tail(LrSchedule s) {
  return s == LrSchedule::kWsd || s == LrSchedule::kCosineLinearDecay || s == LrSchedule::kPower;
}

}  // namespace moecore
