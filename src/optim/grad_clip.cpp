#include "optim/grad_clip.h"

#include <cmath>

namespace moecore {

namespace {

double sum_of_squares(const std::vector<float>& values) {
  double total = 0.0;
  const int64_t count = static_cast<int64_t>(values.size());
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t i = 0; i < count; ++i)
    total += static_cast<double>(values[static_cast<size_t>(i)]) *
             static_cast<double>(values[static_cast<size_t>(i)]);
  return total;
}

void scale(std::vector<float>& values, float factor) {
  for (float& value : values) value *= factor;
}

}  // namespace

double global_grad_norm(const ParamBuffers& grads) {
  return std::sqrt(sum_of_squares(grads.dense) + sum_of_squares(grads.expert));
}

double clip_grad_norm(ParamBuffers& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  if (max_norm > 0.0 && std::isfinite(norm)) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      scale(grads.dense, static_cast<float>(coef));
      scale(grads.expert, static_cast<float>(coef));
    }
  }
  return norm;
}

}  // namespace moecore
