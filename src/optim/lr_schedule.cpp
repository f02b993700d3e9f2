#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moecore {

double learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double lr_min = c.lr * c.min_lr_ratio;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - c.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  switch (c.schedule) {
    case LrSchedule::kCosine:
      return lr_min + (c.lr - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    case LrSchedule::kLinear:
      return c.lr - (c.lr - lr_min) * progress;
    case LrSchedule::kConstant:
      break;
  }
  return c.lr;
}

}  // namespace moecore
