#include "optim/grad_clip.h"

#include <cmath>

#include "core/deterministic_sum.h"

namespace moecore {

namespace {

double sum_of_squares(const std::vector<float>& values) {
  return deterministic_sum(static_cast<int64_t>(values.size()), [&](int64_t i) {
    const double v = static_cast<double>(values[static_cast<size_t>(i)]);
    return v * v;
  });
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
