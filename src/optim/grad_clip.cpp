#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "core/deterministic_sum.h"
#include "core/simd.h"

namespace moecore {

namespace {

constexpr int64_t kSquaresBlock = 1024;
constexpr int64_t kSquaresLanes = 8;

// Squares of one block summed in double over kSquaresLanes lanes, added in lane order: a fixed
// order that vectorises.
MOECORE_SIMD_CLONES double block_sum_of_squares(const float* values, int64_t n) {
  double lanes[kSquaresLanes] = {};
  const int64_t full = n - n % kSquaresLanes;
  for (int64_t j = 0; j < full; j += kSquaresLanes)
    for (int64_t l = 0; l < kSquaresLanes; ++l) {
      const double v = static_cast<double>(values[j + l]);
      lanes[l] += v * v;
    }
  for (int64_t j = full; j < n; ++j) {
    const double v = static_cast<double>(values[j]);
    lanes[j - full] += v * v;
  }
  double total = 0.0;
  for (const double lane : lanes) total += lane;
  return total;
}

}  // namespace

double sum_of_squares(const float* values, size_t count) {
  const int64_t n = static_cast<int64_t>(count);
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  return deterministic_sum(blocks, [&](int64_t b) {
    const int64_t begin = b * kSquaresBlock;
    return block_sum_of_squares(values + begin, std::min(kSquaresBlock, n - begin));
  });
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
    for (float& g : grads.dense) g *= coef;
    for (float& g : grads.expert) g *= coef;
  }
  return norm;
}

}  // namespace moecore
