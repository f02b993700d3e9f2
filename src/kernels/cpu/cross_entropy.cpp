// Softmax cross-entropy and the LM head's z-loss on the CPU: rows over the OpenMP pool, each row's
// max and sum in kSumLanes lanes; the per-row losses are added afterwards in row order, so the
// losses are bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/cross_entropy_checks.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

struct RowLosses {
  double ce = 0.0;
  double lse_squared = 0.0;
};

// The losses of one row (logsumexp - target logit, and logsumexp^2) and, when dz is given, its
// gradient softmax * softmax_scale minus grad_scale at the target, where softmax_scale is
// grad_scale (1 + 2 z_loss_coef logsumexp): d(lse^2)/dz_j = 2 lse softmax_j. Without the z-loss
// the factor is grad_scale itself, the plain cross-entropy's bits.
MOECORE_SIMD_CLONES RowLosses cross_entropy_row(const float* z, int64_t vocab, int32_t target,
                                                float* dz, float grad_scale, float z_loss_coef) {
  const float max_z = lane_max(z, vocab);
  const float sum =
      lane_sum(vocab, [z, max_z](int64_t j) { return exp_vectorizable(z[j] - max_z); });
  const float log_sum = std::log(sum);
  const float lse = log_sum + max_z;
  if (dz != nullptr) {
    const float softmax_scale =
        z_loss_coef != 0.0f ? grad_scale * (1.0f + 2.0f * z_loss_coef * lse) : grad_scale;
    for (int64_t j = 0; j < vocab; ++j)
      dz[j] = exp_vectorizable(z[j] - max_z - log_sum) * softmax_scale;
    dz[target] -= grad_scale;
  }
  return {static_cast<double>(lse - z[target]),
          static_cast<double>(lse) * static_cast<double>(lse)};
}

}  // namespace

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   float z_loss_coef, ConstTensorView normalizer, TensorView losses) {
  constexpr const char* kOp = "cross_entropy";
  expect_normalizer(kOp, normalizer);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [rows, vocab], got rank {}", kOp,
            logits.rank());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_shape(kOp, "logits", logits, {rows, vocab});
  expect_shape(kOp, "targets", targets, {rows});
  expect_shape(kOp, "losses", losses, {kHeadLosses});
  double* means = losses.data<double>(kOp);
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
  std::vector<RowLosses> row_losses(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* dz = dlp != nullptr ? dlp + r * vocab : nullptr;
    if (tp[r] == kIgnoreIndex) {
      if (dz != nullptr) std::fill(dz, dz + vocab, 0.0f);
      continue;
    }
    row_losses[static_cast<size_t>(r)] =
        cross_entropy_row(lp + r * vocab, vocab, tp[r], dz, grad_scale, z_loss_coef);
  }
  double total = 0.0, total_z = 0.0;
  for (const RowLosses& row : row_losses) {
    total += row.ce;
    total_z += row.lse_squared;
  }
  means[kHeadCe] = divisor > 0 ? total / divisor : 0.0;
  means[kHeadZ] = divisor > 0 ? total_z / divisor : 0.0;
}

}  // namespace moecore::kernels::cpu
