// The CPU kernels built on core/simd.h (and AdamW's, cloned the same way) run the clone this CPU
// picks (AVX-512, AVX2 or the baseline, GCC function multiversioning), compiled at -O3 and
// vectorised; this test computes their formulas one element at a time, compiled for the baseline,
// and requires the same bits: core/simd.h's promise that every clone gives bit-identical results,
// checked on the machine that runs it (the output names the clone). A compiler that contracted
// a*b+c, reassociated a lane sum or changed exp_vectorizable's operations in a vectorised loop
// would part from these loops: built with -ffp-contract=fast, the AVX2 clones of the SwiGLU
// gradient and of AdamW part in their last bits. (The baseline ISA has no FMA instruction, so
// nothing in this file can be contracted.)
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/ignore_index.h"
#include "core/simd.h"
#include "core/tensor_view.h"
#include "gradcheck.h"
#include "kernels/cpu/ops.h"

namespace moecore {
namespace {

using gradcheck::random_vec;

const char* clone_for_this_cpu() {
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2)";
  return "baseline";
}

// The first index where two float arrays' bits differ, or -1.
int64_t first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]))
      return static_cast<int64_t>(i);
  return -1;
}

// A float as "%a (%.9g)": its exact value, then its decimal.
std::string exact(float x) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a (%.9g)", static_cast<double>(x), static_cast<double>(x));
  return text;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const int64_t at = first_difference(got, want);
  if (at < 0) return;
  ADD_FAILURE() << what << ": element " << at << " is " << exact(got[static_cast<size_t>(at)])
                << ", want " << exact(want[static_cast<size_t>(at)]) << " (clone "
                << clone_for_this_cpu() << ")";
}

// Widths: the model's (multiples of the 16 lanes and of the 256-term blocks), and odd ones.
constexpr int64_t kWidths[] = {256, 4096, 37, 300, 4099};

TEST(SimdClones, CrossEntropyGivesItsScalarFormulasBits) {
  std::printf("SimdClones: this CPU runs the %s clones\n", clone_for_this_cpu());
  const int64_t rows = 5;
  for (const float z_coef : {0.0f, 0.01f}) {
    for (const int64_t vocab : kWidths) {
      const std::string what =
          "vocab " + std::to_string(vocab) + " z_coef " + std::to_string(z_coef);
      const std::vector<float> logits =
          random_vec(static_cast<size_t>(rows * vocab), 1000 + static_cast<uint32_t>(vocab), -8, 8);
      std::vector<int32_t> targets(rows);
      for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 977) % vocab);
      targets[2] = kIgnoreIndex;
      const float scale = 0.75f;
      std::vector<float> dz(logits.size());
      double losses[kernels::kHeadLosses] = {};
      kernels::cpu::cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                                  view(dz.data(), {rows, vocab}), scale, z_coef, ConstTensorView(),
                                  view(losses, {kernels::kHeadLosses}));
      // The formula, element by element: kernels/cpu/cross_entropy.cpp's.
      std::vector<float> dz_want(logits.size(), 0.0f);
      double total = 0.0, total_z = 0.0;
      const float grad_scale = scale / static_cast<float>(rows - 1);
      for (int64_t r = 0; r < rows; ++r) {
        if (targets[r] == kIgnoreIndex) continue;
        const float* z = logits.data() + r * vocab;
        float* d = dz_want.data() + r * vocab;
        const float max_z = lane_max(z, vocab);
        const float sum =
            lane_sum(vocab, [z, max_z](int64_t j) { return exp_vectorizable(z[j] - max_z); });
        const float log_sum = std::log(sum);
        const float lse = log_sum + max_z;
        const float softmax_scale =
            z_coef != 0.0f ? grad_scale * (1.0f + 2.0f * z_coef * lse) : grad_scale;
        for (int64_t j = 0; j < vocab; ++j)
          d[j] = exp_vectorizable(z[j] - max_z - log_sum) * softmax_scale;
        d[targets[r]] -= grad_scale;
        total += static_cast<double>(lse - z[targets[r]]);
        total_z += static_cast<double>(lse) * static_cast<double>(lse);
      }
      expect_same_bits(dz, dz_want, "cross_entropy dlogits, " + what);
      EXPECT_EQ(std::bit_cast<uint64_t>(losses[kernels::kHeadCe]),
                std::bit_cast<uint64_t>(total / (rows - 1)))
          << what;
      EXPECT_EQ(std::bit_cast<uint64_t>(losses[kernels::kHeadZ]),
                std::bit_cast<uint64_t>(total_z / (rows - 1)))
          << what;
    }
  }
}

TEST(SimdClones, SwigluGivesItsScalarFormulasBits) {
  const int64_t rows = 3;
  for (const int64_t hidden : kWidths) {
    const std::string what = "hidden " + std::to_string(hidden);
    // Gates out to +-100: exp_vectorizable's clamps and both tails of the sigmoid.
    const std::vector<float> gu = random_vec(static_cast<size_t>(rows * 2 * hidden),
                                             2000 + static_cast<uint32_t>(hidden), -100, 100);
    const std::vector<float> dact =
        random_vec(static_cast<size_t>(rows * hidden), 3000 + static_cast<uint32_t>(hidden), -1, 1);
    std::vector<float> act(static_cast<size_t>(rows * hidden));
    std::vector<float> dgu(gu.size());
    kernels::cpu::swiglu_forward(view(gu.data(), {rows, 2 * hidden}),
                                 view(act.data(), {rows, hidden}));
    kernels::cpu::swiglu_backward(view(dact.data(), {rows, hidden}),
                                  view(gu.data(), {rows, 2 * hidden}),
                                  view(dgu.data(), {rows, 2 * hidden}));
    // kernels/cpu/swiglu.cpp's formulas.
    std::vector<float> act_want(act.size()), dgu_want(dgu.size());
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = gu.data() + r * 2 * hidden;
      const float* u = g + hidden;
      const float* da = dact.data() + r * hidden;
      float* dg = dgu_want.data() + r * 2 * hidden;
      float* du = dg + hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
        act_want[static_cast<size_t>(r * hidden + j)] = g[j] * sig * u[j];
        du[j] = da[j] * (g[j] * sig);
        dg[j] = da[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
      }
    }
    expect_same_bits(act, act_want, "swiglu act, " + what);
    expect_same_bits(dgu, dgu_want, "swiglu dgu, " + what);
  }
}

TEST(SimdClones, RmsnormGivesItsScalarFormulasBits) {
  const int64_t rows = 3;
  const float eps = 1e-5f;
  for (const int64_t dim : kWidths) {
    const std::string what = "dim " + std::to_string(dim);
    const std::vector<float> x =
        random_vec(static_cast<size_t>(rows * dim), 4000 + static_cast<uint32_t>(dim), -3, 3);
    const std::vector<float> w = random_vec(static_cast<size_t>(dim), 5000, 0.5f, 1.5f);
    std::vector<float> y(x.size()), rstd(rows);
    kernels::cpu::rmsnorm_forward(view(x.data(), {rows, dim}), view(w.data(), {dim}),
                                  view(y.data(), {rows, dim}), view(rstd.data(), {rows}), eps);
    // kernels/cpu/rmsnorm.cpp's formula.
    std::vector<float> y_want(x.size()), rstd_want(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * dim;
      const float sum_sq = lane_sum(dim, [xr](int64_t j) { return xr[j] * xr[j]; });
      const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
      rstd_want[static_cast<size_t>(r)] = s;
      for (int64_t j = 0; j < dim; ++j)
        y_want[static_cast<size_t>(r * dim + j)] = w[j] * (xr[j] * s);
    }
    expect_same_bits(rstd, rstd_want, "rmsnorm rstd, " + what);
    expect_same_bits(y, y_want, "rmsnorm y, " + what);
  }
}

TEST(SimdClones, AdamwGivesItsScalarFormulasBits) {
  // Step 3 at lr 3e-3, weight decay 0.1, gradient clipping's factor 0.5; one chunk of 16384, three
  // (run by one thread) and ten (over the pool), each with an odd tail.
  const AdamWCoefficients c{1.0f - 3e-3f * 0.1f,
                            0.9f,
                            0.95f,
                            std::sqrt(1.0f - 0.95f * 0.95f * 0.95f),
                            1e-8f,
                            3e-3f / (1.0f - 0.9f * 0.9f * 0.9f),
                            0.5f};
  for (const int64_t n : {int64_t{37}, int64_t{3 * 16384 + 5}, int64_t{10 * 16384 + 11}}) {
    const std::string what = "n " + std::to_string(n);
    const auto size = static_cast<size_t>(n);
    std::vector<float> p = random_vec(size, 6000, -1, 1);
    const std::vector<float> g = random_vec(size, 7000, -3, 3);
    std::vector<float> m = random_vec(size, 8000, -0.1f, 0.1f);
    std::vector<float> v = random_vec(size, 9000, 0, 0.01f);
    std::vector<float> p_want = p, m_want = m, v_want = v;
    kernels::cpu::adamw_update(view(p.data(), {n}), view(g.data(), {n}), view(m.data(), {n}),
                               view(v.data(), {n}), c, ConstTensorView(), ConstTensorView());
    // kernels/cpu/adamw.cpp's update.
    for (size_t i = 0; i < size; ++i) {
      const float gi = g[i] * c.grad_scale;
      p_want[i] *= c.decay_factor;
      m_want[i] = c.b1 * m_want[i] + (1.0f - c.b1) * gi;
      v_want[i] = c.b2 * v_want[i] + (1.0f - c.b2) * gi * gi;
      const float denom = std::sqrt(v_want[i]) / c.bias2_sqrt + c.eps;
      p_want[i] -= c.step_size * m_want[i] / denom;
    }
    expect_same_bits(p, p_want, "adamw params, " + what);
    expect_same_bits(m, m_want, "adamw exp_avg, " + what);
    expect_same_bits(v, v_want, "adamw exp_avg_sq, " + what);
  }
}

}  // namespace
}  // namespace moecore
