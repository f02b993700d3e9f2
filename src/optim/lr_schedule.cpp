#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace moecore {

double learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps,
                     int64_t tokens_per_step) {
  // OLMo-core's schedulers (CosWithWarmup, LinearWithWarmup, ConstantWithWarmup, WSD,
  // InvSqrtWithWarmup, HalfCosWithWarmup, CosWithWarmupAndLinearDecay, PowerLR; warmup_min_lr 0,
  // alpha_f = min_lr_ratio, WSD's decay_min_lr = lr * min_lr_ratio, the others' lr *
  // decay_min_lr_ratio) at t = step + 1: OLMo-core's trainer counts the first update as step 1
  // and asks its scheduler for that step's rate. So the warm-up's last update has the peak rate
  // and the run's last update the final one. Each formula in OLMo-core's order of operations.
  // Counted in tokens, the update's position and the run's length are its tokens seen (OLMo-core
  // adds the batch's tokens before asking) and max_steps x the tokens of an update.
  MOE_CHECK(c.units == LrUnits::kSteps || tokens_per_step > 0,
            "[optim] a schedule in tokens needs the tokens of an update, got {}", tokens_per_step);
  const int64_t unit = schedule_unit(c, tokens_per_step);
  const int64_t t = (step + 1) * unit;
  const int64_t run_horizon = total_steps * unit;  // the run's length, in the units
  // CosWithWarmup, LinearWithWarmup and HalfCosWithWarmup run over their own t_max when set
  // (CosWithWarmupAndLinearDecay's cosine too: cosine_with_warmup_rate), the others the run's.
  const int64_t horizon = own_horizon(c, run_horizon);
  const int64_t warmup = warmup_length(c, horizon);
  const double lr_min = c.lr * c.min_lr_ratio;
  // The linear tails of CosWithWarmupAndLinearDecay and PowerLR: the last `decay` updates fall
  // from the rate at the first of them to lr * decay_min_lr_ratio.
  const bool tail_schedule =
      c.schedule == LrSchedule::kCosineLinearDecay || c.schedule == LrSchedule::kPower;
  const int64_t decay = tail_schedule ? decay_length(c, run_horizon) : 0;
  if (tail_schedule && t >= run_horizon - decay &&
      !(c.schedule == LrSchedule::kPower && t <= warmup)) {
    const double to = c.lr * c.decay_min_lr_ratio;
    return to + (decay_tail_start(c, run_horizon) - to) *
                    static_cast<double>(std::min(run_horizon - t, decay)) /
                    static_cast<double>(decay);
  }
  // CosWithWarmup (and CosWithWarmupAndLinearDecay before its tail): one function for both.
  if (c.schedule == LrSchedule::kCosine || c.schedule == LrSchedule::kCosineLinearDecay)
    return cosine_with_warmup_rate(c, t, run_horizon);
  // HalfCosWithWarmup's warm-up rises to the cosine's half-way rate, where its decay starts.
  const double peak = c.schedule == LrSchedule::kHalfCosine ? lr_min + (c.lr - lr_min) / 2.0 : c.lr;
  // WSD, ConstantWithWarmup and PowerLR warm up through t == warmup ((lr w) / w there, which may
  // be an ulp off lr), the others below it.
  const bool through_warmup = c.schedule == LrSchedule::kWsd ||
                              c.schedule == LrSchedule::kConstant ||
                              c.schedule == LrSchedule::kPower;
  if (t < warmup || (through_warmup && t <= warmup && warmup > 0))
    return peak * static_cast<double>(std::min(t, warmup)) / static_cast<double>(warmup);
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  if (c.schedule == LrSchedule::kPower)  // no floor: the law, until the tail above
    return c.lr * std::pow(static_cast<double>(t) / static_cast<double>(warmup), c.power_exponent);
  // InvSqrtWithWarmup: no end, the rate falls as 1 / sqrt(t) towards lr_min.
  if (c.schedule == LrSchedule::kInvSqrt)
    return lr_min +
           (c.lr - lr_min) * std::sqrt(static_cast<double>(warmup) / static_cast<double>(t));
  if (t >= horizon) return lr_min;  // WSD's formula gives exactly this at the horizon
  if (c.schedule == LrSchedule::kWsd) {
    const int64_t wsd_decay = decay_length(c, horizon);
    if (t < horizon - wsd_decay) return c.lr;
    return lr_min + (c.lr - lr_min) * static_cast<double>(std::min(horizon - t, wsd_decay)) /
                        static_cast<double>(wsd_decay);
  }
  auto current = static_cast<double>(t - warmup);
  auto span = static_cast<double>(horizon - warmup);
  if (c.schedule == LrSchedule::kHalfCosine) {  // the second half of a cosine twice as long
    current += span;
    span *= 2.0;
  }
  if (c.schedule == LrSchedule::kHalfCosine) return cosine_fall(c.lr, lr_min, current, span);
  return c.lr - (c.lr - lr_min) * (current / span);  // linear
}

}  // namespace moecore
