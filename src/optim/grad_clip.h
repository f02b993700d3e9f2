// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: the L2 norm over every gradient
// (dense and expert buffers together); when max_norm > 0 the gradients are scaled by
// min(1, max_norm / (norm + 1e-6)).
#pragma once

#include "model/params.h"

namespace moecore {

double global_grad_norm(const ParamBuffers& grads);

// Returns the norm before clipping.
double clip_grad_norm(ParamBuffers& grads, double max_norm);

}  // namespace moecore
