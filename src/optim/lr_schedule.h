// Learning rate for update `step` (0-based) of `total_steps`, as OLMo-core's schedulers give it
// for its step step + 1: linear warm-up from lr / warmup to lr at update `warmup`, then cosine or
// linear decay to lr * min_lr_ratio at the last update, constant, or OLMo-core's WSD (the peak
// until the last `decay` updates, which fall linearly to lr * min_lr_ratio).
#pragma once

#include <cstdint>

#include "optim/optim_config.h"

namespace moecore {

double learning_rate(const OptimConfig& config, int64_t step, int64_t total_steps);

// The warm-up's length in updates: warmup_steps, or round(total_steps * warmup_fraction) with
// ties to even (Python's round, which OLMo-core's schedulers use).
int64_t warmup_updates(const OptimConfig& config, int64_t total_steps);
// The WSD decay's length in updates: decay_steps when > 0, else round(total_steps *
// decay_fraction), ties to even.
int64_t wsd_decay_updates(const OptimConfig& config, int64_t total_steps);

}  // namespace moecore
