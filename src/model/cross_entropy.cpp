#include "model/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/simd.h"

namespace moecore {

namespace {

// The loss of one row (logsumexp - target logit) and, when dz is given, its gradient
// softmax * grad_scale minus grad_scale at the target. Max and sum reduce in kSumLanes lanes.
MOECORE_SIMD_CLONES double cross_entropy_row(const float* z, int64_t vocab, int32_t target,
                                             float* dz, float grad_scale) {
  const float lowest = -std::numeric_limits<float>::infinity();
  float max_lanes[kSumLanes], sum_lanes_acc[kSumLanes];
  std::fill(max_lanes, max_lanes + kSumLanes, lowest);
  std::fill(sum_lanes_acc, sum_lanes_acc + kSumLanes, 0.0f);
  const int64_t full = vocab - vocab % kSumLanes;
  for (int64_t j = 0; j < full; j += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) max_lanes[l] = std::max(max_lanes[l], z[j + l]);
  for (int64_t j = full; j < vocab; ++j) max_lanes[j - full] = std::max(max_lanes[j - full], z[j]);
  float max_z = lowest;
  for (const float m : max_lanes) max_z = std::max(max_z, m);
  for (int64_t j = 0; j < full; j += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) sum_lanes_acc[l] += exp_vectorizable(z[j + l] - max_z);
  for (int64_t j = full; j < vocab; ++j) sum_lanes_acc[j - full] += exp_vectorizable(z[j] - max_z);
  const float log_sum = std::log(sum_lanes(sum_lanes_acc));
  if (dz != nullptr) {
    for (int64_t j = 0; j < vocab; ++j)
      dz[j] = exp_vectorizable(z[j] - max_z - log_sum) * grad_scale;
    dz[target] -= grad_scale;
  }
  return static_cast<double>(log_sum + max_z - z[target]);
}

}  // namespace

CrossEntropyResult cross_entropy(const float* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab, float* dlogits, float scale, int64_t normalizer) {
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += targets[r] != kIgnoreIndex;
  const int64_t divisor = normalizer > 0 ? normalizer : counted;
  const float grad_scale = divisor > 0 ? scale / static_cast<float>(divisor) : 0.0f;
  // Per-row losses summed afterwards in row order: the result is bit-identical for any thread
  // count.
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    if (targets[r] == kIgnoreIndex) {
      if (dz != nullptr) std::fill(dz, dz + vocab, 0.0f);
      continue;
    }
    row_loss[static_cast<size_t>(r)] =
        cross_entropy_row(logits + r * vocab, vocab, targets[r], dz, grad_scale);
  }
  double total = 0.0;
  for (double loss : row_loss) total += loss;
  return {divisor > 0 ? total / static_cast<double>(divisor) : 0.0, counted};
}

}  // namespace moecore
