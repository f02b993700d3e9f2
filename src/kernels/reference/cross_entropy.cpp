// Softmax cross-entropy, the plain-loop oracle, in double with std::exp and std::log.
#include <algorithm>
#include <cmath>

#include "kernels/cross_entropy_checks.h"
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   float z_loss_coef, ConstTensorView normalizer, TensorView losses) {
  expect_normalizer("cross_entropy", normalizer);
  expect_shape("cross_entropy", "losses", losses, {kHeadLosses});
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const float* lp = logits.data<float>("cross_entropy");
  const int32_t* tp = targets.data<int32_t>("cross_entropy");
  float* dlp = dlogits.raw() != nullptr ? dlogits.data<float>("cross_entropy") : nullptr;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += tp[r] != kIgnoreIndex;
  const double divisor = view_given(normalizer) ? *normalizer.data<double>("cross_entropy")
                                                : static_cast<double>(counted);
  double total = 0.0, total_z = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = lp + r * vocab;
    if (tp[r] == kIgnoreIndex) {
      if (dlp != nullptr) std::fill(dlp + r * vocab, dlp + (r + 1) * vocab, 0.0f);
      continue;
    }
    const double max_z = double{*std::max_element(z, z + vocab)};
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double{z[j]} - max_z);
    const double log_sum_exp = max_z + std::log(sum);
    total += log_sum_exp - double{z[tp[r]]};
    total_z += log_sum_exp * log_sum_exp;
    if (dlp != nullptr) {
      const double grad_scale = divisor > 0 ? double{scale} / divisor : 0.0;
      // d(lse^2)/dz_j = 2 lse softmax_j.
      const double softmax_factor = 1.0 + 2.0 * double{z_loss_coef} * log_sum_exp;
      for (int64_t j = 0; j < vocab; ++j) {
        const double softmax = std::exp(double{z[j]} - log_sum_exp);
        dlp[r * vocab + j] =
            static_cast<float>((softmax * softmax_factor - (j == tp[r] ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  double* out = losses.data<double>("cross_entropy");
  out[kHeadCe] = divisor > 0 ? total / divisor : 0.0;
  out[kHeadZ] = divisor > 0 ? total_z / divisor : 0.0;
}

}  // namespace moecore::kernels::reference
