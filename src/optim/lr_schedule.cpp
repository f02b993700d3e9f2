#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moecore {

double learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  // OLMo-core's schedulers (CosWithWarmup, LinearWithWarmup, ConstantWithWarmup, WSD,
  // InvSqrtWithWarmup; warmup_min_lr 0, alpha_f = min_lr_ratio, WSD's decay_min_lr = lr *
  // min_lr_ratio) at t = step + 1: OLMo-core's trainer counts the first update as step 1 and asks
  // its scheduler for that step's rate. So the warm-up's last update has the peak rate and the
  // run's last update the final one, lr * min_lr_ratio. Each formula in OLMo-core's order of
  // operations.
  const int64_t t = step + 1;
  const int64_t warmup = warmup_updates(c, total_steps);
  // WSD and ConstantWithWarmup warm up through t == warmup ((lr w) / w there, which may be an ulp
  // off lr), CosWithWarmup and LinearWithWarmup below it.
  const bool through_warmup = c.schedule == LrSchedule::kWsd || c.schedule == LrSchedule::kConstant;
  if (t < warmup || (through_warmup && t <= warmup && warmup > 0))
    return c.lr * static_cast<double>(std::min(t, warmup)) / static_cast<double>(warmup);
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  const double lr_min = c.lr * c.min_lr_ratio;
  // InvSqrtWithWarmup: no end, the rate falls as 1 / sqrt(t) towards lr_min.
  if (c.schedule == LrSchedule::kInvSqrt)
    return lr_min +
           (c.lr - lr_min) * std::sqrt(static_cast<double>(warmup) / static_cast<double>(t));
  if (t >= total_steps) return lr_min;  // WSD's formula gives exactly this at t == total_steps
  if (c.schedule == LrSchedule::kWsd) {
    const int64_t decay = wsd_decay_updates(c, total_steps);
    if (t < total_steps - decay) return c.lr;
    return lr_min + (c.lr - lr_min) * static_cast<double>(std::min(total_steps - t, decay)) /
                        static_cast<double>(decay);
  }
  const auto current = static_cast<double>(t - warmup);
  const auto span = static_cast<double>(total_steps - warmup);
  if (c.schedule == LrSchedule::kCosine)
    return lr_min + (c.lr - lr_min) * (1.0 + std::cos(std::numbers::pi * current / span)) / 2.0;
  return c.lr - (c.lr - lr_min) * (current / span);  // linear
}

}  // namespace moecore
