// Learning rate for update `step` (0-based) of `total_steps`, as OLMo-core's schedulers give it
// for its step step + 1: linear warm-up from lr / warmup to lr at update `warmup`, then
//   cosine, linear: decay to lr * min_lr_ratio at the last update (at t_max when set, that floor
//     after it); constant;
//   wsd: the peak until the last `decay` updates, which fall linearly to lr * min_lr_ratio;
//   inv_sqrt: lr_min + (lr - lr_min) sqrt(warmup / t), lr_min = lr * min_lr_ratio, no end;
//   half_cos: the second half of a cosine from lr to lr_min (the warm-up rises to its start,
//     (lr + lr_min) / 2);
//   cosine_linear_decay: the cosine, cut short by the last `decay` updates, which fall linearly
//     from its rate there to lr * decay_min_lr_ratio;
//   power: lr (t / warmup)^power_exponent, then the last `decay` updates fall linearly from that
//     law's rate at their start to lr * decay_min_lr_ratio;
//   wsds: periods of their own lengths, each a wsd from its peak to lr * min_lr_ratio (the
//     warm-up only in the first), that floor after them;
//   exponential: no warm-up, exponential_lr_min (lr / exponential_lr_min)^(t / horizon);
//   composable: its stages' lines and half cosines one after the other, then an override decay;
//   sequential: optim.sequence's schedules one after the other (each from the rate the one
//     before ended at), then an override decay.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "optim/optim_config.h"

namespace moecore {

// Where the run's token count stood when its current batch size and seq_len took over (a resume
// that changed them: train/trainer_state.h's ReplayOrigin); from there every update adds
// tokens_per_step. Zero for a run that never changed them.
struct TokenOrigin {
  int64_t step = 0;
  int64_t tokens = 0;
};

// tokens_per_step: the tokens an update adds (train.batch_size x train.seq_len); needed when the
// schedule counts tokens (units "tokens": OLMo-core's rate at the tokens seen, t x
// tokens_per_step from `origin` on, of a horizon of those plus the remaining updates' tokens, as
// OLMo-core's trainer gives its scheduler global_train_tokens_seen and max_tokens; total_steps x
// tokens_per_step where the batch never changed). `max_tokens` (train.max_tokens; 0: none) is
// that horizon when the run's length is given in tokens: OLMo-core's trainer then gives its
// scheduler max_duration's tokens, which the last update may pass (total_steps is the updates
// until they are reached), and its schedulers answer there as they do: the linear decays of WSD
// and of the tails extrapolate below their floor, the others hold it.
// `initial_lr` (0: optim.lr) is OLMo-core's initial_lr, the rate its schedulers scale: another
// after a batch-size change (train/batch_size_schedule.h). What OLMo-core gives its schedulers as
// rates (warmup_min_lr, WSD's, WSDS's and the tails' decay_min_lr, the composable stages'
// start_lr and end_lr: optim.lr x their ratios here) stays put; what they derive from initial_lr
// (the peak, the alpha_f floors, the stages' fractions) moves with it.
double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps,
                     int64_t tokens_per_step = 0, TokenOrigin origin = {}, int64_t max_tokens = 0,
                     double initial_lr = 0.0);

// OLMo-core's SequentialScheduler: the initial_lr of the schedule after `entry` (an entry of
// optim.sequence that began at `initial_lr`), the entry's rate at its own end:
// get_lr(initial_lr, current = max, t_max = max).
double sequence_next_initial_lr(const OptimConfig& entry, double initial_lr);

// OLMo-core's _linear_warmup: from warmup_min_lr to `peak` over `warmup` units, at t (with
// warmup_min_lr 0, peak t / warmup exactly: adding and subtracting 0 changes no bits).
inline double warmup_rate(const OptimConfig& c, double peak, int64_t t, int64_t warmup) {
  return c.warmup_min_lr + (peak - c.warmup_min_lr) * static_cast<double>(std::min(t, warmup)) /
                               static_cast<double>(warmup);
}

// OLMo-core's _linear_decay: the last `decay` units of a line from `from` to `to`, at
// `units_left` units before its end.
inline double linear_decay_rate(double from, double to, int64_t units_left, int64_t decay) {
  return to + (from - to) * static_cast<double>(std::min(units_left, decay)) /
                  static_cast<double>(decay);
}

// OLMo-core's cosine from lr at current = 0 to lr_min at current = span, in its order of
// operations.
inline double cosine_fall(double lr, double lr_min, double current, double span) {
  return lr_min + (lr - lr_min) * (1.0 + std::cos(std::numbers::pi * current / span)) / 2.0;
}

// OLMo-core's CosWithWarmup at t of a run of run_horizon (its units: its step t, 1-based, of
// total_steps, or tokens): the warm-up below t = warmup, then the cosine from initial_lr to
// initial_lr * min_lr_ratio (its alpha_f) at its horizon (optim.t_max_steps / t_max_tokens, or the
// run's), that floor after it.
inline double cosine_with_warmup_rate(const OptimConfig& c, int64_t t, int64_t run_horizon,
                                      double initial_lr) {
  const int64_t horizon = own_horizon(c, run_horizon);
  const int64_t warmup = warmup_length(c, horizon);
  const double lr_min = initial_lr * c.min_lr_ratio;
  if (t < warmup) return warmup_rate(c, initial_lr, t, warmup);
  if (t >= horizon) return lr_min;
  return cosine_fall(initial_lr, lr_min, static_cast<double>(t - warmup),
                     static_cast<double>(horizon - warmup));
}

// The rate a decay tail of cosine_linear_decay or power falls from: the cosine's, or the power
// law's initial_lr (t / warmup)^power_exponent, at the tail's start t = horizon - decay.
inline double decay_tail_start(const OptimConfig& c, int64_t horizon, double initial_lr) {
  const int64_t first = horizon - decay_length(c, horizon);
  if (c.schedule == LrSchedule::kPower)
    return initial_lr *
           std::pow(static_cast<double>(first) / static_cast<double>(warmup_length(c, horizon)),
                    c.power_exponent);
  return cosine_with_warmup_rate(c, first, horizon, initial_lr);
}

}  // namespace moecore
