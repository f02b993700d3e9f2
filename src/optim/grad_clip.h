// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: the L2 norm over every gradient
// (dense and expert buffers together); when max_norm > 0 the gradients are scaled by
// min(1, max_norm / (norm + 1e-6)).
#pragma once

#include <array>
#include <span>

#include "core/workspace.h"
#include "model/params.h"

namespace moecore {

// The sums of squares of two spans of floats (in one device's memory), each in double as
// kernels::sum_of_squares makes it (the same for any thread count), computed where they are into
// two doubles of `scratch` and read back in one copy: on a GPU, one wait for both.
std::array<double, 2> sums_of_squares(std::span<const float> first, std::span<const float> second,
                                      Workspace& scratch);

// The factor clipping applies to every gradient: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 or the norm is not finite (such a step is skipped, not clipped).
float clip_coefficient(double max_norm, double norm);

double global_grad_norm(const ParamBuffers& grads);

// Returns the norm before clipping.
double clip_grad_norm(ParamBuffers& grads, double max_norm);

}  // namespace moecore
