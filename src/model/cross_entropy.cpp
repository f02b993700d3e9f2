#include "model/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"

namespace moecore {

namespace {

// The loss of one row (logsumexp - target logit) and, when dz is given, its gradient
// softmax * grad_scale minus grad_scale at the target. Max and sum reduce in kSumLanes lanes.
MOECORE_SIMD_CLONES double cross_entropy_row(const float* z, int64_t vocab, int32_t target,
                                             float* dz, float grad_scale) {
  const float max_z = lane_max(z, vocab);
  const float sum =
      lane_sum(vocab, [z, max_z](int64_t j) { return exp_vectorizable(z[j] - max_z); });
  const float log_sum = std::log(sum);
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
