#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace moecore {

double sum_of_squares(const float* values, size_t count) {
  return kernels::sum_of_squares(view(values, {static_cast<int64_t>(count)}));
}

float clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

double global_grad_norm(const ParamBuffers& grads) {
  return std::sqrt(sum_of_squares(grads.dense.data(), grads.dense.size()) +
                   sum_of_squares(grads.expert.data(), grads.expert.size()));
}

double clip_grad_norm(ParamBuffers& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  const float coef = clip_coefficient(max_norm, norm);
  if (coef < 1.0f) {
    for (DeviceArray<float>* group : {&grads.dense, &grads.expert}) {
      const int64_t count = static_cast<int64_t>(group->size());
      kernels::scale(view(group->data(), {count}), coef, view(group->data(), {count}));
    }
  }
  return norm;
}

}  // namespace moecore
