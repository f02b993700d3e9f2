#include "optim/adamw.h"

#include <cmath>

namespace moecore {

AdamW::AdamW(const ParamLayout& layout, const OptimConfig& config)
    : layout_(layout), config_(config), m_(layout), v_(layout) {}

void AdamW::step(ParamBuffers& params, const ParamBuffers& grads, double lr) {
  ++step_;
  const double t = static_cast<double>(step_);
  const float b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  const float bias1 = static_cast<float>(1.0 - std::pow(config_.beta1, t));
  const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config_.beta2, t)));
  const float eps = static_cast<float>(config_.eps);
  const float step_size = static_cast<float>(lr) / bias1;
  for (const ParamSpec& spec : layout_.specs()) {
    const bool decay = !spec.is_norm && !spec.is_embedding;
    const float decay_factor = decay ? 1.0f - static_cast<float>(lr * config_.weight_decay) : 1.0f;
    float* p = params.at(spec);
    const float* g = grads.at(spec);
    float* m = m_.at(spec);
    float* v = v_.at(spec);
    const int64_t count = static_cast<int64_t>(spec.numel);
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) {
      p[i] *= decay_factor;
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      p[i] -= step_size * m[i] / denom;
    }
  }
}

}  // namespace moecore
