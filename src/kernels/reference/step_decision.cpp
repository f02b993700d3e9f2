// The optimizer step's decision, the plain-loop oracle: the trainer's rules written out on the
// host's doubles (train/pipeline_runner.cpp's sum of the rows, optim/grad_clip.h's clipping,
// train/step_guard.h's limits).
#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "kernels/step_decision_checks.h"

namespace moecore::kernels::reference {

void step_decision(ConstTensorView loss_rows, ConstTensorView squares, const StepDecisionOptions& o,
                   ConstTensorView limits, TensorView decision, TensorView step_factors) {
  constexpr const char* kOp = "step_decision";
  const int64_t rows = step_decision_rows(kOp, loss_rows, squares, decision, step_factors);
  expect_step_limits(kOp, limits);
  const double loss_limit = view_given(limits) ? limits.data<double>(kOp)[0] : o.loss_limit;
  const double norm_limit = view_given(limits) ? limits.data<double>(kOp)[1] : o.norm_limit;
  const double* r = loss_rows.data<double>(kOp);
  const double* sq = squares.data<double>(kOp);
  double loss = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const double* row = r + kLossParts * i;
    const double total = row[kCeLoss] + o.lb_coef * row[kLbLoss] + o.z_coef * row[kZLoss] +
                         o.lm_z_coef * row[kLmZLoss];
    loss += total * o.loss_scale;
  }
  const double norm = std::sqrt(sq[0] + sq[1]);
  const bool apply =
      std::isfinite(loss) && std::isfinite(norm) && !(loss > loss_limit) && !(norm > norm_limit);
  const float clip = o.max_grad_norm <= 0.0 || !std::isfinite(norm)
                         ? 1.0f
                         : static_cast<float>(std::min(1.0, o.max_grad_norm / (norm + 1e-6)));
  double* d = decision.data<double>(kOp);
  d[0] = loss;
  d[1] = norm;
  d[2] = apply ? 1.0 : 0.0;
  float* f = step_factors.data<float>(kOp);
  f[0] = clip;
  f[1] = apply ? 1.0f : 0.0f;
}

}  // namespace moecore::kernels::reference
