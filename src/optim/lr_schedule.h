// Learning rate for update `step` (0-based) of `total_steps`, as OLMo-core's schedulers give it
// for its step step + 1: linear warm-up from lr / warmup_steps to lr at update warmup_steps, then
// cosine or linear decay to lr * min_lr_ratio at the last update (or constant).
#pragma once

#include <cstdint>

#include "optim/optim_config.h"

namespace moecore {

double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps);

}  // namespace moecore
