#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/check.h"

namespace moecore {

namespace {

// OLMo-core's WSDS at t (its get_lr, decay_min_lr lr x min_lr_ratio, the peaks initial_lr x
// the periods' multipliers): the warm-up takes the first period's start, so the periods'
// positions count from its end.
double wsds_rate(const OptimConfig& c, int64_t t, double initial_lr) {
  const std::vector<int64_t>& periods = period_lengths(c);
  const int64_t warmup = warmup_length(c, periods.front());
  auto peak = [&](size_t i) {
    return c.period_lr_multipliers.empty() ? initial_lr : initial_lr * c.period_lr_multipliers[i];
  };
  if (t < warmup) return warmup_rate(c, peak(0), t, warmup);
  const double lr_min = c.lr * c.min_lr_ratio;
  const int64_t position = t - warmup;
  int64_t end = 0;  // of the periods after the warm-up
  for (const int64_t length : periods) end += length;
  if (position >= end - warmup) return lr_min;
  int64_t start = 0;
  for (size_t i = 0; i < periods.size(); ++i) {
    const int64_t length = periods[i] - (i == 0 ? warmup : 0);
    if (position > start + length) {
      start += length;
      continue;
    }
    // The period's stable part, then its decay of decay_length(the whole period) units.
    const int64_t at = std::clamp<int64_t>(position - start, 0, length);
    const int64_t decay = decay_length(c, periods[i]);
    const int64_t stable = length - decay;
    if (at < stable) return peak(i);
    return linear_decay_rate(peak(i), lr_min, decay - (at - stable), decay);
  }
  return lr_min;  // not reached: position < end - warmup
}

// OLMo-core's _interpolate_lr: position `current` of `duration` from `start` to `end`.
double interpolate_rate(LrShape shape, double start, double end, int64_t current,
                        int64_t duration) {
  if (shape == LrShape::kLinear)
    return start + (end - start) * static_cast<double>(current) / static_cast<double>(duration);
  return end + (start - end) *
                   (1.0 + std::cos(std::numbers::pi * static_cast<double>(current) /
                                   static_cast<double>(duration))) /
                   2.0;
}

// OLMo-core's ComposableScheduler's stages at t (its _main_schedule_lr; the fractions are of
// initial_lr, start_lr and end_lr rates).
double composable_stages_rate(const OptimConfig& c, int64_t t, double initial_lr) {
  int64_t stage_start = 0;
  double previous_end = initial_lr;
  for (const LrStage& stage : c.stages) {
    const double start = stage.start_lr            ? *stage.start_lr
                         : stage.start_lr_fraction ? initial_lr * *stage.start_lr_fraction
                                                   : previous_end;
    const double end =
        stage.end_lr ? *stage.end_lr : initial_lr * stage.end_lr_fraction.value_or(0.0);
    const int64_t stage_end = stage_start + stage.duration;
    if (t < stage_end)
      return interpolate_rate(stage.shape, start, end, t - stage_start, stage.duration);
    previous_end = end;
    stage_start = stage_end;
  }
  return previous_end;
}

// OverrideDecay (ComposableScheduler's and SequentialScheduler's get_lr): before its start the
// main schedule's rate, `main(position)`; from there a decay from the main schedule's rate at its
// start to its end rate, held after it.
template <typename MainRate>
double with_override_decay(const OptimConfig& c, int64_t t, double initial_lr, MainRate main) {
  if (!c.override_decay || t < c.override_decay->start) return main(t);
  const LrOverrideDecay& o = *c.override_decay;
  const double end = o.end_lr ? *o.end_lr : initial_lr * o.end_lr_fraction.value_or(0.0);
  if (t - o.start >= o.duration) return end;
  return interpolate_rate(o.shape, main(o.start), end, t - o.start, o.duration);
}

double schedule_rate(const OptimConfig& c, int64_t t, int64_t run_horizon, double lr);

// SequentialScheduler's _sequential_lr: the first schedule whose sequence_max t has not passed,
// over min(t_max, its sequence_max), from the rate the one before gave at its own end (t and
// t_max counted from its start); the last to the end.
double sequential_rate(const OptimConfig& c, int64_t t, int64_t t_max, double initial_lr) {
  for (size_t i = 0; i + 1 < c.sequence.size(); ++i) {
    const OptimConfig& part = c.sequence[i];
    const int64_t length = part.sequence_max;
    if (t <= length) return schedule_rate(part, t, std::min(t_max, length), initial_lr);
    initial_lr = sequence_next_initial_lr(part, initial_lr);
    t -= length;
    t_max -= length;
  }
  return schedule_rate(c.sequence.back(), t, t_max, initial_lr);
}

// OLMo-core's get_lr(initial_lr, current = t, t_max = run_horizon) of the schedule `c` names: lr
// is its initial_lr; c.lr is optim.lr, the base of the rates OLMo-core holds absolute.
double schedule_rate(const OptimConfig& c, int64_t t, int64_t run_horizon, double lr) {
  // WSDS and ComposableScheduler run over their own lengths; ExponentialScheduler rises from lr_min
  // to lr at the run's end (t >= 1: its lr_min at t = 0 is never asked for).
  if (c.schedule == LrSchedule::kWsds) return wsds_rate(c, t, lr);
  if (c.schedule == LrSchedule::kComposable)
    return with_override_decay(c, t, lr,
                               [&](int64_t at) { return composable_stages_rate(c, at, lr); });
  if (c.schedule == LrSchedule::kSequential)
    return with_override_decay(c, t, lr,
                               [&](int64_t at) { return sequential_rate(c, at, run_horizon, lr); });
  if (c.schedule == LrSchedule::kExponential) {
    if (t >= run_horizon) return lr;
    return c.exponential_lr_min *
           std::pow(lr / c.exponential_lr_min,
                    static_cast<double>(t) / static_cast<double>(run_horizon));
  }
  // CosWithWarmup, LinearWithWarmup and HalfCosWithWarmup run over their own t_max when set
  // (CosWithWarmupAndLinearDecay's cosine too: cosine_with_warmup_rate), the others the run's.
  const int64_t horizon = own_horizon(c, run_horizon);
  const int64_t warmup = warmup_length(c, horizon);
  // alpha_f's floor, of initial_lr (WSD's decay_min_lr below is a rate: of optim.lr).
  const double lr_min = lr * c.min_lr_ratio;
  // The linear tails of CosWithWarmupAndLinearDecay and PowerLR: the last `decay` updates fall
  // from the rate at the first of them to lr * decay_min_lr_ratio.
  const bool tail_schedule =
      c.schedule == LrSchedule::kCosineLinearDecay || c.schedule == LrSchedule::kPower;
  const int64_t decay = tail_schedule ? decay_length(c, run_horizon) : 0;
  if (tail_schedule && t >= run_horizon - decay &&
      !(c.schedule == LrSchedule::kPower && t <= warmup)) {
    return linear_decay_rate(decay_tail_start(c, run_horizon, lr), c.lr * c.decay_min_lr_ratio,
                             run_horizon - t, decay);
  }
  // CosWithWarmup (and CosWithWarmupAndLinearDecay before its tail): one function for both.
  if (c.schedule == LrSchedule::kCosine || c.schedule == LrSchedule::kCosineLinearDecay)
    return cosine_with_warmup_rate(c, t, run_horizon, lr);
  // HalfCosWithWarmup's warm-up rises to the cosine's half-way rate, where its decay starts.
  const double peak = c.schedule == LrSchedule::kHalfCosine ? lr_min + (lr - lr_min) / 2.0 : lr;
  // WSD, ConstantWithWarmup and PowerLR warm up through t == warmup ((lr w) / w there, which may
  // be an ulp off lr), the others below it.
  const bool through_warmup = c.schedule == LrSchedule::kWsd ||
                              c.schedule == LrSchedule::kConstant ||
                              c.schedule == LrSchedule::kPower;
  if (t < warmup || (through_warmup && t <= warmup && warmup > 0))
    return warmup_rate(c, peak, t, warmup);
  if (c.schedule == LrSchedule::kConstant) return lr;
  if (c.schedule == LrSchedule::kPower)  // no floor: the law, until the tail above
    return lr * std::pow(static_cast<double>(t) / static_cast<double>(warmup), c.power_exponent);
  // InvSqrtWithWarmup: no end, the rate falls as 1 / sqrt(t) towards lr_min.
  if (c.schedule == LrSchedule::kInvSqrt)
    return lr_min + (lr - lr_min) * std::sqrt(static_cast<double>(warmup) / static_cast<double>(t));
  // WSD has no floor: its decay line gives lr_min exactly at the horizon and, as OLMo-core's,
  // goes on below it past there (an update that ends past train.max_tokens).
  if (c.schedule == LrSchedule::kWsd) {
    const int64_t wsd_decay = decay_length(c, horizon);
    if (t < horizon - wsd_decay) return lr;
    return linear_decay_rate(lr, c.lr * c.min_lr_ratio, horizon - t, wsd_decay);
  }
  if (t >= horizon) return lr_min;
  const auto current = static_cast<double>(t - warmup);
  const auto span = static_cast<double>(horizon - warmup);
  if (c.schedule == LrSchedule::kHalfCosine)  // the second half of a cosine twice as long
    return cosine_fall(lr, lr_min, current + span, span * 2.0);
  return lr - (lr - lr_min) * (current / span);  // linear
}

}  // namespace

double sequence_next_initial_lr(const OptimConfig& entry, double initial_lr) {
  return schedule_rate(entry, entry.sequence_max, entry.sequence_max, initial_lr);
}

double learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps,
                     int64_t tokens_per_step, TokenOrigin origin, int64_t max_tokens,
                     double initial_lr) {
  // OLMo-core's schedulers (CosWithWarmup, LinearWithWarmup, ConstantWithWarmup, WSD,
  // InvSqrtWithWarmup, HalfCosWithWarmup, CosWithWarmupAndLinearDecay, PowerLR, WSDS,
  // ExponentialScheduler, ComposableScheduler, SequentialScheduler; alpha_f = min_lr_ratio, WSD's
  // decay_min_lr = lr * min_lr_ratio, the others' lr * decay_min_lr_ratio) at t = step + 1:
  // OLMo-core's trainer counts the first update as step 1 and asks its scheduler for that step's
  // rate. So the warm-up's last update has the peak rate and the run's last update the final one.
  // Each formula in OLMo-core's order of operations. Counted in tokens, the update's position and
  // the run's length are its tokens seen (OLMo-core adds the batch's tokens before asking) and
  // those plus the remaining updates' (max_steps x the tokens of an update where the batch never
  // changed), or train.max_tokens where that gives the run's length.
  const double lr = initial_lr > 0.0 ? initial_lr : c.lr;  // OLMo-core's initial_lr
  MOE_CHECK(c.units == LrUnits::kSteps || tokens_per_step > 0,
            "[optim] a schedule in tokens needs the tokens of an update, got {}", tokens_per_step);
  const int64_t unit = schedule_unit(c, tokens_per_step);
  // The tokens seen at the origin beyond origin.step updates of this batch (another batch size or
  // seq_len before it); in steps the rate depends on the step alone.
  const int64_t shift = c.units == LrUnits::kTokens ? origin.tokens - origin.step * unit : 0;
  const int64_t t = shift + (step + 1) * unit;
  // The run's length, in the units: train.max_tokens where it gives a schedule in tokens its
  // length (the last update may pass it), else where the last update ends.
  const int64_t run_horizon =
      c.units == LrUnits::kTokens && max_tokens > 0 ? max_tokens : shift + total_steps * unit;
  return schedule_rate(c, t, run_horizon, lr);
}

}  // namespace moecore
