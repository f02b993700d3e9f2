// The chunked LM head (model/chunked_lm_head.h) against a double-precision reference of the head
// and its cross-entropy, with the whole head (linear + cross_entropy over all rows, what
// Transformer runs without chunks) held to the same bound: loss, hidden-state gradient and the
// head's weight gradient, for chunk sizes that divide the tokens, leave a short last chunk, equal
// one token and exceed the tokens, with and without a loss scale, without and with the LM head's
// z-loss (the mean logsumexp^2, reported, and its gradient weighted by z_coef).
//
// The bound is derived from fp32 rounding, per element, not tuned: u = 2^-24, gamma_K = K u /
// (1 - K u). A logit is a length-d dot product: |error| <= E_t = gamma_d max_j sum_i |h_ti W_ji|
// for row t. Softmax probabilities move by at most a factor exp(2 E_t) under such logit errors,
// and the kernel's own exp, sum over the vocabulary and log add (v + 16) u relative: rho_t = 2 E_t
// + (v + 16) u relative to p, plus u absolute (the target's p - 1). The GEMMs of the gradients add
// gamma_K times the sum of |terms| over their contraction (v for dhidden, the tokens for dW), and
// carry the logit gradient's error through the same terms. The z-loss: logsumexp is off by at most
// delta_t = E_t + (v + 16) u |lse| (the logits' error and the kernel's own), its square by 2 |lse|
// delta_t + delta_t^2; its gradient's factor (1 + 2 z_coef lse) by 2 z_coef delta_t plus 4 u of
// itself (three roundings and the product with p). Both heads get a factor 2 of headroom.
// A wrong chunk (a missed or repeated row, a lost scale, a gradient replaced instead of added) is
// off by the size of the values, >1e3 times the bound here (checked).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ignore_index.h"
#include "core/tensor_view.h"
#include "core/workspace.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/chunked_lm_head.h"
#include "model/linear.h"

namespace moecore {
namespace {

using gradcheck::random_vec;

constexpr int64_t kTokenCount = 37, kHidden = 16, kVocab = 50;
constexpr double kU = 0x1p-24;

double gamma(int64_t k) {
  return static_cast<double>(k) * kU / (1.0 - static_cast<double>(k) * kU);
}

struct Head {
  std::vector<float> hidden = random_vec(kTokenCount * kHidden, 11, -1.5f, 1.5f);
  std::vector<float> weight = random_vec(kVocab * kHidden, 12, -0.5f, 0.5f);
  std::vector<int32_t> targets;
  double counted = 0;  // the count the head divides by, as the model hands it over
  Head() {
    for (int64_t t = 0; t < kTokenCount; ++t)
      targets.push_back(t % 7 == 3 ? kIgnoreIndex : static_cast<int32_t>((t * 13 + 5) % kVocab));
    for (int32_t target : targets) counted += target != kIgnoreIndex;
  }
  ConstTensorView divisor() const { return view(&counted, {1}); }
};

// The head's loss and gradients, and what each may be off by in fp32.
struct ChunkedResult {
  double loss = 0.0;
  double lm_z = 0.0;  // the z-loss, unscaled
  std::vector<double> dhidden, dweight;
};
struct Reference {
  ChunkedResult exact;
  double loss_bound = 0.0, lm_z_bound = 0.0;
  std::vector<double> dhidden_bound, dweight_bound;
};

Reference reference(const Head& head, float loss_scale, float z_coef) {
  const double zc = static_cast<double>(z_coef);
  const double n_counted = head.counted;
  const double s = static_cast<double>(loss_scale);
  Reference r;
  r.exact.dhidden.assign(kTokenCount * kHidden, 0.0);
  r.exact.dweight.assign(kVocab * kHidden, 0.0);
  r.dhidden_bound.assign(kTokenCount * kHidden, 0.0);
  r.dweight_bound.assign(kVocab * kHidden, 0.0);
  std::vector<double> dl(kVocab), dl_err(kVocab);
  for (int64_t t = 0; t < kTokenCount; ++t) {
    const int32_t target = head.targets[static_cast<size_t>(t)];
    if (target == kIgnoreIndex) continue;
    std::vector<double> z(kVocab);
    double logit_err = 0.0;
    for (int64_t j = 0; j < kVocab; ++j) {
      double dot = 0.0, abs_dot = 0.0;
      for (int64_t i = 0; i < kHidden; ++i) {
        const double term = static_cast<double>(head.hidden[t * kHidden + i]) *
                            static_cast<double>(head.weight[j * kHidden + i]);
        dot += term;
        abs_dot += std::abs(term);
      }
      z[j] = dot;
      logit_err = std::max(logit_err, gamma(kHidden) * abs_dot);
    }
    const double max_z = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (double zj : z) sum += std::exp(zj - max_z);
    const double lse = max_z + std::log(sum);
    r.exact.loss += (lse - z[target]) / n_counted;
    r.loss_bound +=
        (2.0 * logit_err + (kVocab + 16) * kU * (std::abs(lse) + std::abs(z[target]))) / n_counted;
    const double lse_err = logit_err + (kVocab + 16) * kU * std::abs(lse);
    r.exact.lm_z += lse * lse / n_counted;
    r.lm_z_bound += (2.0 * std::abs(lse) * lse_err + lse_err * lse_err) / n_counted;
    const double rho = 2.0 * logit_err + (kVocab + 16) * kU;
    const double factor = 1.0 + 2.0 * zc * lse;
    const double factor_err = 2.0 * zc * lse_err + 4.0 * kU * std::abs(factor);
    for (int64_t j = 0; j < kVocab; ++j) {
      const double p = std::exp(z[j] - lse);
      dl[j] = s * (p * factor - (j == target ? 1.0 : 0.0)) / n_counted;
      dl_err[j] = s * (rho * p * std::abs(factor) + p * factor_err + kU) / n_counted;
    }
    for (int64_t i = 0; i < kHidden; ++i) {
      double dh = 0.0, dh_abs = 0.0, dh_err = 0.0;
      for (int64_t j = 0; j < kVocab; ++j) {
        const double w = static_cast<double>(head.weight[j * kHidden + i]);
        dh += dl[j] * w;
        dh_abs += std::abs(dl[j] * w);
        dh_err += dl_err[j] * std::abs(w);
      }
      r.exact.dhidden[t * kHidden + i] = dh;
      r.dhidden_bound[t * kHidden + i] = dh_err + gamma(kVocab) * dh_abs;
    }
    for (int64_t j = 0; j < kVocab; ++j)
      for (int64_t i = 0; i < kHidden; ++i) {
        const double h = static_cast<double>(head.hidden[t * kHidden + i]);
        r.exact.dweight[j * kHidden + i] += dl[j] * h;
        r.dweight_bound[j * kHidden + i] +=
            dl_err[j] * std::abs(h) + gamma(kTokenCount) * std::abs(dl[j] * h);
      }
  }
  return r;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// What Transformer runs without chunks: the logits of every row, the cross-entropy with its
// gradient at scale 1, then times loss_scale, then both GEMMs of the linear backward.
ChunkedResult whole_head(const Head& head, float loss_scale, float z_coef) {
  std::vector<float> logits(kTokenCount * kVocab), dlogits(logits.size()), scaled(logits.size());
  std::vector<float> dhidden(kTokenCount * kHidden), dweight(kVocab * kHidden, 0.0f);
  double losses[kernels::kHeadLosses] = {};
  const ConstTensorView w = view(head.weight.data(), {kVocab, kHidden});
  linear_forward(kernels::MatmulPrecision::kFp32, head.hidden.data(), w, logits.data(), kTokenCount,
                 kHidden, kVocab);
  kernels::cross_entropy(view(logits.data(), {kTokenCount, kVocab}),
                         view(head.targets.data(), {kTokenCount}),
                         view(dlogits.data(), {kTokenCount, kVocab}), 1.0f, z_coef, head.divisor(),
                         view(losses, {kernels::kHeadLosses}));
  kernels::scale(view(dlogits.data(), {kTokenCount, kVocab}), loss_scale,
                 view(scaled.data(), {kTokenCount, kVocab}));
  linear_backward(kernels::MatmulPrecision::kFp32, scaled.data(), head.hidden.data(), w,
                  dhidden.data(), dweight.data(), kTokenCount, kHidden, kVocab, false);
  return {losses[kernels::kHeadCe], losses[kernels::kHeadZ], widen(dhidden), widen(dweight)};
}

// passes > 1: the backward runs that many times into the same weight gradient, which must add
// up (then divided by passes, exactly: a power of two).
ChunkedResult chunked_head(const Head& head, float loss_scale, float z_coef, int64_t chunk_tokens,
                           int passes = 1) {
  const LmHeadChunks shape{kTokenCount, kHidden, kVocab, chunk_tokens};
  Workspace workspace;
  std::vector<double> losses(static_cast<size_t>(shape.count() * kernels::kHeadLosses), -1.0);
  const ConstTensorView w = view(head.weight.data(), {kVocab, kHidden});
  chunked_lm_head_forward(kernels::MatmulPrecision::kFp32, head.hidden.data(), w,
                          head.targets.data(), shape, head.divisor(),
                          view(losses.data(), {shape.count(), kernels::kHeadLosses}), workspace);
  // dhidden is overwritten (=), the weight gradient added to (+=).
  std::vector<float> dhidden(kTokenCount * kHidden, 7.0f), dweight(kVocab * kHidden, 0.0f);
  for (int pass = 0; pass < passes; ++pass)
    chunked_lm_head_backward(kernels::MatmulPrecision::kFp32, head.hidden.data(), w,
                             head.targets.data(), shape, head.divisor(), z_coef, loss_scale,
                             dhidden.data(), dweight.data(), workspace);
  for (float& g : dweight) g /= static_cast<float>(passes);
  ChunkedResult result{0.0, 0.0, widen(dhidden), widen(dweight)};
  for (int64_t c = 0; c < shape.count(); ++c) {
    result.loss += losses[static_cast<size_t>(c * kernels::kHeadLosses + kernels::kHeadCe)];
    result.lm_z += losses[static_cast<size_t>(c * kernels::kHeadLosses + kernels::kHeadZ)];
  }
  return result;
}

// max over elements of |got - exact| / bound (<= 1 within the bound).
double worst_ratio(const std::vector<double>& got, const std::vector<double>& exact,
                   const std::vector<double>& bound) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - exact[i]) / std::max(bound[i], 1e-300));
  return worst;
}

void expect_within(const ChunkedResult& got, const Reference& ref, const std::string& what) {
  EXPECT_LE(std::abs(got.loss - ref.exact.loss), 2.0 * ref.loss_bound) << what << ": loss";
  EXPECT_LE(std::abs(got.lm_z - ref.exact.lm_z), 2.0 * ref.lm_z_bound) << what << ": z-loss";
  EXPECT_LE(worst_ratio(got.dhidden, ref.exact.dhidden, ref.dhidden_bound), 2.0)
      << what << ": dhidden";
  EXPECT_LE(worst_ratio(got.dweight, ref.exact.dweight, ref.dweight_bound), 2.0)
      << what << ": dweight";
}

TEST(ChunkedLmHead, ChunkCountsCoverTheTokens) {
  const LmHeadChunks shape{37, 16, 50, 8};
  EXPECT_EQ(shape.count(), 5);
  EXPECT_EQ(shape.first_row(4), 32);
  EXPECT_EQ(shape.rows(4), 5);
  EXPECT_EQ(shape.rows(0), 8);
  EXPECT_EQ((LmHeadChunks{37, 16, 50, 37}.count()), 1);
  EXPECT_EQ((LmHeadChunks{37, 16, 50, 100}.rows(0)), 37);
}

TEST(ChunkedLmHead, MatchesTheReferenceAsTheWholeHeadDoes) {
  const Head head;
  for (float z_coef : {0.0f, 0.1f}) {
    for (float loss_scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
      const std::string what =
          "loss_scale " + std::to_string(loss_scale) + ", z_coef " + std::to_string(z_coef);
      const Reference ref = reference(head, loss_scale, z_coef);
      expect_within(whole_head(head, loss_scale, z_coef), ref, "whole head, " + what);
      for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{37}, int64_t{64}})
        expect_within(chunked_head(head, loss_scale, z_coef, chunk), ref,
                      "chunks of " + std::to_string(chunk) + ", " + what);
      // Twice into the same gradient: the passes add (the rounding of adding a chunk to a
      // gradient of the same size, u per chunk, is inside the factor 2 of the bound).
      expect_within(chunked_head(head, loss_scale, z_coef, 8, 2), ref,
                    "two backward passes, " + what);
    }
  }
}

TEST(ChunkedLmHead, TheBoundIsFarBelowTheValues) {
  // The test above could not miss a wrong row or a lost scale: each bound is under 1e-3 of the
  // largest value of its tensor.
  const Reference ref = reference(Head(), 0.25f, 0.0f);
  auto largest = [](const std::vector<double>& v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
  };
  EXPECT_LT(2.0 * ref.loss_bound, 1e-3 * ref.exact.loss);
  EXPECT_LT(2.0 * ref.lm_z_bound, 1e-3 * ref.exact.lm_z);
  EXPECT_LT(2.0 * largest(ref.dhidden_bound), 1e-3 * largest(ref.exact.dhidden));
  EXPECT_LT(2.0 * largest(ref.dweight_bound), 1e-3 * largest(ref.exact.dweight));
  // And a chunk left out is seen: the last chunk's rows missing from dW.
  const Head head;
  Head shorter = head;
  for (int64_t t = 32; t < kTokenCount; ++t) shorter.targets[static_cast<size_t>(t)] = kIgnoreIndex;
  shorter.counted = head.counted;  // the same divisor: only the last rows' terms are gone
  const ChunkedResult missing = chunked_head(shorter, 0.25f, 0.0f, 8);
  EXPECT_GT(worst_ratio(missing.dweight, ref.exact.dweight, ref.dweight_bound), 1e3);
  // And the z-loss's gradient is seen: the head trained without it is far outside the bound
  // of the head with it.
  const Reference with_z = reference(head, 0.25f, 0.1f);
  EXPECT_GT(worst_ratio(chunked_head(head, 0.25f, 0.0f, 8).dweight, with_z.exact.dweight,
                        with_z.dweight_bound),
            1e3);
}

}  // namespace
}  // namespace moecore
