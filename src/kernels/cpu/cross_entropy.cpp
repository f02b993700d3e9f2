// Softmax cross-entropy on the CPU: rows over the OpenMP pool, each row's max and sum in
// kSumLanes lanes; the per-row losses are added afterwards in row order, so the loss is
// bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/cross_entropy_checks.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

// The loss of one row (logsumexp - target logit) and, when dz is given, its gradient
// softmax * grad_scale minus grad_scale at the target.
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

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   ConstTensorView normalizer, TensorView loss) {
  constexpr const char* kOp = "cross_entropy";
  expect_normalizer(kOp, normalizer);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [rows, vocab], got rank {}", kOp,
            logits.rank());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_shape(kOp, "logits", logits, {rows, vocab});
  expect_shape(kOp, "targets", targets, {rows});
  expect_shape(kOp, "loss", loss, {1});
  double* mean = loss.data<double>(kOp);
  const float* lp = logits.data<float>(kOp);
  const int32_t* tp = targets.data<int32_t>(kOp);
  float* dlp = nullptr;
  if (dlogits.raw() != nullptr) {
    expect_shape(kOp, "dlogits", dlogits, {rows, vocab});
    dlp = dlogits.data<float>(kOp);
  }
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    MOE_CHECK(tp[r] == kIgnoreIndex || (tp[r] >= 0 && tp[r] < vocab),
              "[{}] target {} at row {} is outside [0, {})", kOp, tp[r], r, vocab);
    counted += tp[r] != kIgnoreIndex;
  }
  const double divisor =
      view_given(normalizer) ? *normalizer.data<double>(kOp) : static_cast<double>(counted);
  const float grad_scale = divisor > 0 ? scale / static_cast<float>(divisor) : 0.0f;
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* dz = dlp != nullptr ? dlp + r * vocab : nullptr;
    if (tp[r] == kIgnoreIndex) {
      if (dz != nullptr) std::fill(dz, dz + vocab, 0.0f);
      continue;
    }
    row_loss[static_cast<size_t>(r)] =
        cross_entropy_row(lp + r * vocab, vocab, tp[r], dz, grad_scale);
  }
  double total = 0.0;
  for (double row : row_loss) total += row;
  *mean = divisor > 0 ? total / divisor : 0.0;
}

}  // namespace moecore::kernels::cpu
