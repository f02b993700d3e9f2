// Learning rate for update `step` (0-based) of `total_steps`: linear warm-up from lr/warmup to lr
// over warmup_steps, then cosine, linear or constant decay to lr * min_lr_ratio at total_steps.
#pragma once

#include <cstdint>

#include "optim/optim_config.h"

namespace moecore {

double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps);

}  // namespace moecore
