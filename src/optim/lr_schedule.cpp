#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace moecore {

double learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  // OLMo-core's schedulers (CosWithWarmup, LinearWithWarmup, ConstantWithWarmup; warmup_min_lr 0,
  // alpha_f = min_lr_ratio) at t = step + 1: OLMo-core's trainer counts the first update as step 1
  // and asks its scheduler for that step's rate. So the warm-up's last update has the peak rate
  // and the run's last update the final one, lr * min_lr_ratio.
  const int64_t t = step + 1;
  if (t < c.warmup_steps)
    return c.lr * static_cast<double>(t) / static_cast<double>(c.warmup_steps);
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  const double lr_min = c.lr * c.min_lr_ratio;
  if (t >= total_steps) return lr_min;
  const double progress =
      static_cast<double>(t - c.warmup_steps) / static_cast<double>(total_steps - c.warmup_steps);
  if (c.schedule == LrSchedule::kCosine)
    return lr_min + (c.lr - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return c.lr - (c.lr - lr_min) * progress;  // linear
}

}  // namespace moecore
