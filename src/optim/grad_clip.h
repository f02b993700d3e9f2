// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: the L2 norm over every gradient
// (dense and expert buffers together); when max_norm > 0 the gradients are scaled by
// min(1, max_norm / (norm + 1e-6)).
#pragma once

#include <cstddef>

#include "model/params.h"

namespace moecore {

// Sum of squares of `count` values, in double, the same for any thread count.
double sum_of_squares(const float* values, size_t count);

// The factor clipping applies to every gradient: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 or the norm is not finite (such a step is skipped, not clipped).
float clip_coefficient(double max_norm, double norm);

double global_grad_norm(const ParamBuffers& grads);

// Returns the norm before clipping.
double clip_grad_norm(ParamBuffers& grads, double max_norm);

}  // namespace moecore
