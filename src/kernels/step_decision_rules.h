// The arithmetic of step_decision as one serial walk, shared by the CPU backend and the CUDA
// kernel (nvcc compiles this header) so that both give the host's bits: the step's loss as the
// trainer adds it up (train/pipeline_runner.cpp), the norm as the optimizer takes it, the clipping
// coefficient as optim/grad_clip.h's clip_coefficient and the spike guard's test as
// train/step_guard.h's, each operation rounded on its own (kernels/host_device.h).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/loss_parts.h"

namespace moecore::kernels {

// kernels/ops.h's StepDecisionOptions, field for field (nvcc does not compile ops.h).
struct StepDecisionScalars {
  double max_grad_norm, loss_limit, norm_limit, lb_coef, z_coef, lm_z_coef, loss_scale;
};

// rows [row_count, kLossParts], squares [2]; limits [2] {loss, norm}, or null (the scalars');
// decision [3] (=) and factors [2] (=).
MOECORE_HOST_DEVICE inline void step_decision_in_order(const double* rows, int64_t row_count,
                                                       const double* squares,
                                                       const StepDecisionScalars& o,
                                                       const double* limits, double* decision,
                                                       float* factors) {
  const double loss_limit = limits != nullptr ? limits[0] : o.loss_limit;
  const double norm_limit = limits != nullptr ? limits[1] : o.norm_limit;
  double loss = 0.0;
  for (int64_t i = 0; i < row_count; ++i) {
    const double* r = rows + kLossParts * i;
    const double total = add_rn(
        add_rn(add_rn(r[kCeLoss], mul_rn(o.lb_coef, r[kLbLoss])), mul_rn(o.z_coef, r[kZLoss])),
        mul_rn(o.lm_z_coef, r[kLmZLoss]));
    loss = add_rn(loss, mul_rn(total, o.loss_scale));
  }
  const double norm = sqrt_rn(add_rn(squares[0], squares[1]));
  const bool apply = finite(loss) && finite(norm) && loss <= loss_limit && norm <= norm_limit;
  float clip = 1.0f;
  if (o.max_grad_norm > 0.0 && finite(norm)) {
    const double ratio = o.max_grad_norm / add_rn(norm, 1e-6);
    clip = static_cast<float>(ratio < 1.0 ? ratio : 1.0);
  }
  decision[0] = loss;
  decision[1] = norm;
  decision[2] = apply ? 1.0 : 0.0;
  factors[0] = clip;
  factors[1] = apply ? 1.0f : 0.0f;
}

}  // namespace moecore::kernels
