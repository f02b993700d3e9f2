// Learning rate for update `step` (0-based) of `total_steps`, as OLMo-core's schedulers give it
// for its step step + 1: linear warm-up from lr / warmup to lr at update `warmup`, then cosine or
// linear decay to lr * min_lr_ratio at the last update, constant, or OLMo-core's WSD (the peak
// until the last `decay` updates, which fall linearly to lr * min_lr_ratio).
#pragma once

#include <cstdint>

#include "optim/optim_config.h"

namespace moecore {

double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps);

}  // namespace moecore
