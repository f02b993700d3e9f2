#include "kernels/fill_normal.h"

#include <cmath>
#include <random>

namespace moecore::kernels {

void fill_normal(std::span<const NormalFill> fills) {
  const auto count = static_cast<int64_t>(fills.size());
  // Targets differ in size by orders of magnitude (a norm's bias against an embedding): handed
  // out one at a time, so that a thread with a small one takes the next.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < count; ++t) {
    const NormalFill& fill = fills[static_cast<size_t>(t)];
    std::mt19937_64 engine(fill.seed);
    std::normal_distribution<float> normal(0.0f, fill.stddev);
    const float bound = 3.0f * fill.stddev;
    for (size_t i = 0; i < fill.count; ++i) {
      float value = normal(engine);
      while (fill.truncated && std::fabs(value) > bound) value = normal(engine);
      fill.values[i] = value;
    }
  }
}

}  // namespace moecore::kernels
