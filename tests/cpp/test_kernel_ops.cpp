// The per-op harness (kernel_harness.h): every kernel of every registered backend against the
// plain-loop oracle on random shapes, odd sizes included, and every backward against central
// differences of the backend's own forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "gradcheck.h"
#include "kernel_harness.h"

namespace moecore {
namespace {

using gradcheck::added;
using gradcheck::check_all;
using gradcheck::expect_close;
using gradcheck::project;
using gradcheck::random_vec;
using kernel_harness::backend_name;
using kernel_harness::nmse;
using kernel_harness::nmse_bound;
using kernel_harness::offsets_view;
using kernel_harness::oracle;
using kernels::KernelBackend;

// Step of the central differences: large enough that fp32 rounding noise (~u |L| / eps) stays
// far below gradcheck::kTolerance, small enough that the O(eps^2) truncation does too.
constexpr float kFdEps = 1e-2f;

// Rows x width pairs: 1 and sizes that are not multiples of the 16 SIMD lanes or of the thread
// count, next to round ones.
struct Shape2d {
  int64_t rows, cols;
};
const std::vector<Shape2d> kShapes = {{1, 1}, {3, 5}, {7, 17}, {2, 64}, {33, 67}, {5, 130}};

void expect_nmse(const std::vector<float>& got, const std::vector<float>& ref, int64_t reduction,
                 const std::string& what) {
  const double err = nmse(got, ref);
  EXPECT_LE(err, nmse_bound(reduction)) << what;
}

class KernelOps : public ::testing::TestWithParam<const KernelBackend*> {
 protected:
  const KernelBackend& backend() const { return *GetParam(); }
};

TEST_P(KernelOps, RmsnormMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().rmsnorm_backward, backend().rmsnorm_forward);
  uint32_t seed = 100;
  for (const auto [rows, dim] : kShapes) {
    const std::string what = "rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
    std::vector<float> x = random_vec(static_cast<size_t>(rows * dim), ++seed);
    std::vector<float> w = random_vec(static_cast<size_t>(dim), ++seed, 0.5f, 1.5f);
    const std::vector<float> dy = random_vec(x.size(), ++seed);
    const float eps = 1e-6f;
    std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
    std::vector<float> y_ref(x.size()), rstd_ref(rstd.size());
    backend().rmsnorm_forward(view(x.data(), {rows, dim}), view(w.data(), {dim}),
                              view(y.data(), {rows, dim}), view(rstd.data(), {rows}), eps);
    oracle().rmsnorm_forward(view(x.data(), {rows, dim}), view(w.data(), {dim}),
                             view(y_ref.data(), {rows, dim}), view(rstd_ref.data(), {rows}), eps);
    expect_nmse(y, y_ref, dim, "rmsnorm y " + what);
    expect_nmse(rstd, rstd_ref, dim, "rmsnorm rstd " + what);

    // Backward, both gradient rules: dx overwritten and accumulated, dw accumulated.
    for (const bool accumulate_dx : {false, true}) {
      const std::vector<float> dx_before = random_vec(x.size(), ++seed);
      const std::vector<float> dw_before = random_vec(w.size(), ++seed);
      std::vector<float> dx = dx_before, dw = dw_before, dx_ref = dx_before, dw_ref = dw_before;
      backend().rmsnorm_backward(view(dy.data(), {rows, dim}), view(x.data(), {rows, dim}),
                                 view(w.data(), {dim}), view(rstd.data(), {rows}),
                                 view(dx.data(), {rows, dim}), view(dw.data(), {dim}),
                                 accumulate_dx);
      oracle().rmsnorm_backward(view(dy.data(), {rows, dim}), view(x.data(), {rows, dim}),
                                view(w.data(), {dim}), view(rstd.data(), {rows}),
                                view(dx_ref.data(), {rows, dim}), view(dw_ref.data(), {dim}),
                                accumulate_dx);
      // dw sums over rows, dx over the row: the longer of the two reductions. With dim 1 the
      // exact dx is O(eps / x^2) (dy w minus nearly itself): both sides are cancellation noise,
      // which no relative bound describes, so only the accumulate rule is compared there.
      if (dim > 1) expect_nmse(dx, dx_ref, dim, "rmsnorm dx " + what);
      expect_nmse(dw, dw_ref, std::max(rows, dim), "rmsnorm dw " + what);
    }

    // Finite differences of L = sum(y * dy) (dim 1 has a zero gradient in x: skipped).
    auto loss = [&] {
      backend().rmsnorm_forward(view(x.data(), {rows, dim}), view(w.data(), {dim}),
                                view(y.data(), {rows, dim}), view(rstd.data(), {rows}), eps);
      return project(y.data(), dy);
    };
    loss();
    std::vector<float> dx(x.size()), dw(w.size(), 0.0f);
    backend().rmsnorm_backward(view(dy.data(), {rows, dim}), view(x.data(), {rows, dim}),
                               view(w.data(), {dim}), view(rstd.data(), {rows}),
                               view(dx.data(), {rows, dim}), view(dw.data(), {dim}), false);
    if (dim > 1) expect_close(check_all(x.data(), x.size(), dx.data(), kFdEps, loss), "dx " + what);
    expect_close(check_all(w.data(), w.size(), dw.data(), kFdEps, loss), "dw " + what);
  }
}

TEST_P(KernelOps, SwigluMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().swiglu_backward, backend().swiglu_forward);
  uint32_t seed = 200;
  for (const auto [rows, hidden] : kShapes) {
    const std::string what = "rows=" + std::to_string(rows) + " hidden=" + std::to_string(hidden);
    std::vector<float> gu = random_vec(static_cast<size_t>(rows * 2 * hidden), ++seed, -4.0f, 4.0f);
    const std::vector<float> da = random_vec(static_cast<size_t>(rows * hidden), ++seed);
    std::vector<float> act(da.size()), act_ref(da.size());
    backend().swiglu_forward(view(gu.data(), {rows, 2 * hidden}), view(act.data(), {rows, hidden}));
    oracle().swiglu_forward(view(gu.data(), {rows, 2 * hidden}),
                            view(act_ref.data(), {rows, hidden}));
    expect_nmse(act, act_ref, 1, "swiglu act " + what);
    std::vector<float> dgu(gu.size()), dgu_ref(gu.size());
    backend().swiglu_backward(view(da.data(), {rows, hidden}), view(gu.data(), {rows, 2 * hidden}),
                              view(dgu.data(), {rows, 2 * hidden}));
    oracle().swiglu_backward(view(da.data(), {rows, hidden}), view(gu.data(), {rows, 2 * hidden}),
                             view(dgu_ref.data(), {rows, 2 * hidden}));
    expect_nmse(dgu, dgu_ref, 1, "swiglu dgu " + what);
    auto loss = [&] {
      backend().swiglu_forward(view(gu.data(), {rows, 2 * hidden}),
                               view(act.data(), {rows, hidden}));
      return project(act.data(), da);
    };
    expect_close(check_all(gu.data(), gu.size(), dgu.data(), kFdEps, loss), "dgu " + what);
  }
}

// A bf16 output (what only bf16 GEMMs read: the experts' SwiGLU output and its gradient) holds
// float_to_bf16 of the fp32 output, bit for bit, on every backend and the oracle.
TEST_P(KernelOps, SwigluWritesBf16AsTheRoundedFp32Output) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().swiglu_backward, backend().swiglu_forward);
  const int64_t rows = 37, hidden = 70;
  const std::vector<float> gu =
      random_vec(static_cast<size_t>(rows * 2 * hidden), 230, -4.0f, 4.0f);
  const std::vector<float> da = random_vec(static_cast<size_t>(rows * hidden), 231);
  auto rounded = [](const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    std::transform(v.begin(), v.end(), bits.begin(), float_to_bf16);
    return bits;
  };
  for (const bool use_oracle : {false, true}) {
    const auto& ops = use_oracle ? oracle() : backend();
    const std::string what = use_oracle ? "oracle" : "backend";
    std::vector<float> act(da.size());
    std::vector<uint16_t> act16(da.size());
    ops.swiglu_forward(view(gu.data(), {rows, 2 * hidden}), view(act.data(), {rows, hidden}));
    ops.swiglu_forward(view(gu.data(), {rows, 2 * hidden}),
                       TensorView(act16.data(), {rows, hidden}, DType::kBf16));
    EXPECT_EQ(act16, rounded(act)) << "act " << what;
    std::vector<float> dgu(gu.size());
    std::vector<uint16_t> dgu16(gu.size());
    ops.swiglu_backward(view(da.data(), {rows, hidden}), view(gu.data(), {rows, 2 * hidden}),
                        view(dgu.data(), {rows, 2 * hidden}));
    ops.swiglu_backward(view(da.data(), {rows, hidden}), view(gu.data(), {rows, 2 * hidden}),
                        TensorView(dgu16.data(), {rows, 2 * hidden}, DType::kBf16));
    EXPECT_EQ(dgu16, rounded(dgu)) << "dgu " << what;
    std::vector<int32_t> wrong(da.size());
    EXPECT_THROW(ops.swiglu_forward(view(gu.data(), {rows, 2 * hidden}),
                                    TensorView(wrong.data(), {rows, hidden}, DType::kI32)),
                 Error)
        << what;
  }
}

TEST_P(KernelOps, EmbeddingMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().embedding_backward, backend().embedding_forward);
  uint32_t seed = 300;
  std::mt19937 gen(7);
  for (const auto [rows, dim] : kShapes) {
    const int64_t vocab = rows + 3;
    const std::string what = "rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
    std::vector<int32_t> tokens(static_cast<size_t>(rows));
    // Few ids for many rows, so that repeated tokens accumulate in the backward.
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab / 2));
    for (auto& t : tokens) t = id(gen);
    std::vector<float> w = random_vec(static_cast<size_t>(vocab * dim), ++seed);
    const std::vector<float> dout = random_vec(static_cast<size_t>(rows * dim), ++seed);
    std::vector<float> out(dout.size()), out_ref(dout.size());
    backend().embedding_forward(view(tokens.data(), {rows}), view(w.data(), {vocab, dim}),
                                view(out.data(), {rows, dim}));
    oracle().embedding_forward(view(tokens.data(), {rows}), view(w.data(), {vocab, dim}),
                               view(out_ref.data(), {rows, dim}));
    EXPECT_EQ(out, out_ref) << "embedding is a copy: " << what;
    const std::vector<float> dw_before = random_vec(w.size(), ++seed);
    std::vector<float> dw = dw_before, dw_ref = dw_before;
    backend().embedding_backward(view(tokens.data(), {rows}), view(dout.data(), {rows, dim}),
                                 view(dw.data(), {vocab, dim}), -1);
    oracle().embedding_backward(view(tokens.data(), {rows}), view(dout.data(), {rows, dim}),
                                view(dw_ref.data(), {vocab, dim}), -1);
    expect_nmse(dw, dw_ref, rows, "embedding dw " + what);
    // A padding id (the first row's token): its row is left as it was, the others as without.
    std::vector<float> dw_pad = dw_before, dw_pad_ref = dw_before;
    const int32_t pad = tokens[0];
    backend().embedding_backward(view(tokens.data(), {rows}), view(dout.data(), {rows, dim}),
                                 view(dw_pad.data(), {vocab, dim}), pad);
    oracle().embedding_backward(view(tokens.data(), {rows}), view(dout.data(), {rows, dim}),
                                view(dw_pad_ref.data(), {vocab, dim}), pad);
    expect_nmse(dw_pad, dw_pad_ref, rows, "embedding dw with a padding id " + what);
    for (int64_t v = 0; v < vocab; ++v)
      for (int64_t j = 0; j < dim; ++j) {
        const size_t i = static_cast<size_t>(v * dim + j);
        if (v == pad) {
          EXPECT_EQ(dw_pad[i], dw_before[i]) << "the padding row moved: " << what;
        } else {
          EXPECT_EQ(dw_pad[i], dw[i]) << "another row changed: " << what;
        }
      }
    auto loss = [&] {
      backend().embedding_forward(view(tokens.data(), {rows}), view(w.data(), {vocab, dim}),
                                  view(out.data(), {rows, dim}));
      return project(out.data(), dout);
    };
    const std::vector<float> gw = added(dw, dw_before);
    expect_close(check_all(w.data(), w.size(), gw.data(), kFdEps, loss), "dw " + what);
  }
  std::vector<int32_t> bad = {0, 5};
  std::vector<float> w(8), out(4);
  EXPECT_THROW(backend().embedding_forward(view(bad.data(), {2}), view(w.data(), {4, 2}),
                                           view(out.data(), {2, 2})),
               Error);
}

TEST_P(KernelOps, RopeMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().rope_backward, backend().rope_forward);
  struct RopeShape {
    int64_t batch, seq, heads, head_dim, first_position;
  };
  uint32_t seed = 400;
  for (const RopeShape s : {RopeShape{1, 1, 1, 2, 0}, RopeShape{2, 5, 3, 6, 0},
                            RopeShape{1, 9, 2, 34, 4}, RopeShape{3, 7, 1, 16, 1}}) {
    const std::string what = "seq=" + std::to_string(s.seq) +
                             " head_dim=" + std::to_string(s.head_dim) +
                             " first=" + std::to_string(s.first_position);
    const int64_t positions = s.first_position + s.seq, half = s.head_dim / 2;
    // Any angles: the kernels take the table as given (model/rope.h builds HF's).
    std::vector<float> cos(static_cast<size_t>(positions * half)), sin(cos.size());
    const std::vector<float> angle = random_vec(cos.size(), ++seed, -3.0f, 3.0f);
    for (size_t i = 0; i < cos.size(); ++i) {
      cos[i] = std::cos(angle[i]);
      sin[i] = std::sin(angle[i]);
    }
    const auto table_cos = view(cos.data(), {positions, half});
    const auto table_sin = view(sin.data(), {positions, half});
    std::vector<float> x =
        random_vec(static_cast<size_t>(s.batch * s.seq * s.heads * s.head_dim), ++seed);
    const std::vector<float> r = random_vec(x.size(), ++seed);
    std::vector<float> y = x, y_ref = x;
    backend().rope_forward(view(y.data(), {s.batch, s.seq, s.heads, s.head_dim}), table_cos,
                           table_sin, s.first_position);
    oracle().rope_forward(view(y_ref.data(), {s.batch, s.seq, s.heads, s.head_dim}), table_cos,
                          table_sin, s.first_position);
    expect_nmse(y, y_ref, 2, "rope " + what);
    std::vector<float> g = r, g_ref = r;
    backend().rope_backward(view(g.data(), {s.batch, s.seq, s.heads, s.head_dim}), table_cos,
                            table_sin, s.first_position);
    oracle().rope_backward(view(g_ref.data(), {s.batch, s.seq, s.heads, s.head_dim}), table_cos,
                           table_sin, s.first_position);
    expect_nmse(g, g_ref, 2, "rope_backward " + what);
    auto loss = [&] {
      y = x;
      backend().rope_forward(view(y.data(), {s.batch, s.seq, s.heads, s.head_dim}), table_cos,
                             table_sin, s.first_position);
      return project(y.data(), r);
    };
    expect_close(check_all(x.data(), x.size(), g.data(), kFdEps, loss), "dx " + what);
  }
}

TEST_P(KernelOps, CrossEntropyMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().cross_entropy);
  uint32_t seed = 500;
  std::mt19937 gen(11);
  for (const auto [rows, vocab] : kShapes) {
    std::vector<float> logits = random_vec(static_cast<size_t>(rows * vocab), ++seed, -5.0f, 5.0f);
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = i % 3 == 1 ? kIgnoreIndex : id(gen);
    // The rows' own count, and a global one given where the logits are; without and with the LM
    // head's z-loss in the gradient (0.3: its gradient 2 * 0.3 * lse * softmax is of the
    // cross-entropy's size for these logits, so a wrong factor shows).
    const double global_count = static_cast<double>(rows + 2);
    for (const ConstTensorView& normalizer : {ConstTensorView(), view(&global_count, {1})}) {
      for (const float z_coef : {0.0f, 0.3f}) {
        const std::string what = "rows=" + std::to_string(rows) +
                                 " vocab=" + std::to_string(vocab) +
                                 " z_coef=" + std::to_string(z_coef);
        const float scale = 0.75f;
        std::vector<float> dz(logits.size()), dz_ref(logits.size());
        double got[kernels::kHeadLosses] = {}, ref[kernels::kHeadLosses] = {};
        backend().cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                                view(dz.data(), {rows, vocab}), scale, z_coef, normalizer,
                                view(got, {kernels::kHeadLosses}));
        oracle().cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                               view(dz_ref.data(), {rows, vocab}), scale, z_coef, normalizer,
                               view(ref, {kernels::kHeadLosses}));
        // Both losses: an fp32 log-sum-exp per row (relative error within ~vocab u, kept in
        // nmse_bound's form; squaring doubles it: 4x in nmse), summed in double.
        EXPECT_LE(std::pow(got[kernels::kHeadCe] - ref[kernels::kHeadCe], 2),
                  nmse_bound(vocab) * ref[kernels::kHeadCe] * ref[kernels::kHeadCe])
            << what;
        EXPECT_LE(std::pow(got[kernels::kHeadZ] - ref[kernels::kHeadZ], 2),
                  4.0 * nmse_bound(vocab) * ref[kernels::kHeadZ] * ref[kernels::kHeadZ])
            << what;
        expect_nmse(dz, dz_ref, vocab, "cross_entropy dlogits " + what);
        // Forward only (no gradient view) gives the same losses.
        double forward_only[kernels::kHeadLosses] = {};
        backend().cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                                TensorView{}, scale, z_coef, normalizer,
                                view(forward_only, {kernels::kHeadLosses}));
        EXPECT_EQ(forward_only[kernels::kHeadCe], got[kernels::kHeadCe]) << what;
        EXPECT_EQ(forward_only[kernels::kHeadZ], got[kernels::kHeadZ]) << what;
        // dlogits is the gradient of scale * (loss + z_coef z-loss).
        auto loss = [&] {
          double r[kernels::kHeadLosses] = {};
          backend().cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                                  TensorView{}, scale, z_coef, normalizer,
                                  view(r, {kernels::kHeadLosses}));
          return static_cast<double>(scale) *
                 (r[kernels::kHeadCe] + static_cast<double>(z_coef) * r[kernels::kHeadZ]);
        };
        const bool counted_any = std::any_of(targets.begin(), targets.end(),
                                             [](int32_t t) { return t != kIgnoreIndex; });
        if (counted_any && vocab > 1)
          expect_close(check_all(logits.data(), logits.size(), dz.data(), kFdEps, loss),
                       "dlogits " + what);
      }
    }
  }
}

TEST_P(KernelOps, AdamwMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().adamw_update);
  uint32_t seed = 600;
  // One element, a SIMD tail, and more than four 16384-element chunks (the threaded path).
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{5 * 16384 + 3}}) {
    std::vector<float> p = random_vec(static_cast<size_t>(n), ++seed);
    const std::vector<float> g = random_vec(p.size(), ++seed);
    std::vector<float> m = random_vec(p.size(), ++seed, -0.1f, 0.1f);
    std::vector<float> v = random_vec(p.size(), ++seed, 0.0f, 0.01f);
    std::vector<float> p_ref = p, m_ref = m, v_ref = v;
    // Step 3 at lr 1e-3, wd 0.1, betas (0.9, 0.95), clipped by 0.5.
    const AdamWCoefficients c{1.0f - 1e-4f, 0.9f,
                              0.95f,        std::sqrt(1.0f - 0.95f * 0.95f * 0.95f),
                              1e-8f,        1e-3f / (1.0f - 0.9f * 0.9f * 0.9f),
                              0.5f};
    backend().adamw_update(view(p.data(), {n}), view(g.data(), {n}), view(m.data(), {n}),
                           view(v.data(), {n}), c, TensorView(), TensorView());
    oracle().adamw_update(view(p_ref.data(), {n}), view(g.data(), {n}), view(m_ref.data(), {n}),
                          view(v_ref.data(), {n}), c, TensorView(), TensorView());
    // Elementwise: a handful of fp32 roundings per element, no reduction.
    const std::string what = "n=" + std::to_string(n);
    expect_nmse(p, p_ref, 1, "adamw params " + what);
    expect_nmse(m, m_ref, 1, "adamw exp_avg " + what);
    expect_nmse(v, v_ref, 1, "adamw exp_avg_sq " + what);
  }
}

TEST_P(KernelOps, SumOfSquaresMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().sum_of_squares);
  uint32_t seed = 700;
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1025}, int64_t{70001}}) {
    const std::vector<float> x = random_vec(static_cast<size_t>(n), ++seed);
    double got = -1.0, ref = -2.0;
    backend().sum_of_squares(view(x.data(), {n}), view(&got, {1}));
    oracle().sum_of_squares(view(x.data(), {n}), view(&ref, {1}));
    // Both sum positive terms in double: within n * 2^-53 relative of each other.
    EXPECT_LE(std::abs(got - ref), static_cast<double>(n + 1) * std::ldexp(1.0, -53) * ref)
        << "n=" << n;
  }
}

// The cases of both attention tests: one token, GQA with odd sizes, more positions than one
// 64-row block, documents (of lengths 4, 3, 2 in every row).
struct AttentionCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool documents;
};
const std::vector<AttentionCase> kAttentionCases = {
    {1, 1, 1, 1, 1, false},
    {2, 5, 4, 2, 3, false},
    {1, 70, 2, 1, 8, false},
    {2, 9, 3, 3, 5, true},
    // Documents across several of a tiled kernel's query tiles (32 rows on the GPU).
    {2, 70, 4, 2, 16, true}};

// The flash test's head dimensions of real models, in bf16 only (the cases above run both
// precisions). On the GPU, bf16 up to head dimension 128 runs on tensor-core kernels that take the
// head in fragments of 16 dimensions (72 padded to 128) and the positions in tiles of 64 rows (16
// per warp): these cross tiles, warps and sub-tiles, with GQA and documents. 144 is past them:
// bf16 on the CUDA-core kernels, which fp32 runs at every head dimension.
const std::vector<AttentionCase> kBf16HeadDimCases = {{1, 100, 4, 2, 64, true},
                                                      {1, 130, 2, 1, 72, false},
                                                      {2, 80, 2, 2, 128, true},
                                                      {1, 40, 2, 1, 144, true}};

// Random q, k, v and output gradient of a case, its document starts (empty: none), and its name.
struct AttentionInputs {
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> doc_start;
  std::string what;
};

AttentionInputs attention_inputs(const AttentionCase& c, uint32_t& seed) {
  const int64_t B = c.batch, T = c.seq, H = c.heads, KV = c.kv_heads, hd = c.head_dim;
  AttentionInputs in;
  in.what = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
            " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd);
  in.q = random_vec(static_cast<size_t>(B * T * H * hd), ++seed);
  in.k = random_vec(static_cast<size_t>(B * T * KV * hd), ++seed);
  in.v = random_vec(in.k.size(), ++seed);
  in.dout = random_vec(in.q.size(), ++seed);
  if (c.documents)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        in.doc_start.push_back(t < 4 ? 0 : t < 7 ? 4 : t < 40 ? 7 : 40);
  return in;
}

TEST_P(KernelOps, CausalAttentionMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().causal_attention_backward,
                                  backend().causal_attention_forward);
  uint32_t seed = 800;
  for (const AttentionCase& c : kAttentionCases) {
    const int64_t B = c.batch, T = c.seq, H = c.heads, KV = c.kv_heads, hd = c.head_dim;
    AttentionInputs in = attention_inputs(c, seed);
    const std::string& what = in.what;
    std::vector<float>&q = in.q, &k = in.k, &v = in.v;
    const std::vector<float>& dout = in.dout;
    const ConstTensorView docs =
        c.documents ? view(in.doc_start.data(), {B, T}) : ConstTensorView{};
    std::vector<float> out(q.size()), probs(static_cast<size_t>(B * H * T * T));
    std::vector<float> out_ref(out.size()), probs_ref(probs.size());
    auto forward = [&](const KernelBackend& b, std::vector<float>& o, std::vector<float>& p) {
      b.causal_attention_forward(view(q.data(), {B, T, H, hd}), view(k.data(), {B, T, KV, hd}),
                                 view(v.data(), {B, T, KV, hd}), view(o.data(), {B, T, H, hd}),
                                 view(p.data(), {B, H, T, T}), docs,
                                 kernels::MatmulPrecision::kFp32);
    };
    forward(backend(), out, probs);
    forward(oracle(), out_ref, probs_ref);
    expect_nmse(probs, probs_ref, T + hd, "attention probs " + what);
    expect_nmse(out, out_ref, T + hd, "attention out " + what);

    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
    auto backward = [&](const KernelBackend& b, std::vector<float>& gq, std::vector<float>& gk,
                        std::vector<float>& gv) {
      b.causal_attention_backward(view(dout.data(), {B, T, H, hd}), view(q.data(), {B, T, H, hd}),
                                  view(k.data(), {B, T, KV, hd}), view(v.data(), {B, T, KV, hd}),
                                  view(probs.data(), {B, H, T, T}), view(gq.data(), {B, T, H, hd}),
                                  view(gk.data(), {B, T, KV, hd}), view(gv.data(), {B, T, KV, hd}),
                                  kernels::MatmulPrecision::kFp32);
    };
    backward(backend(), dq, dk, dv);
    backward(oracle(), dq_ref, dk_ref, dv_ref);
    // dk and dv sum over the T queries of every head of their group.
    const int64_t kv_reduction = (H / KV) * T + hd;
    expect_nmse(dq, dq_ref, T + hd, "attention dq " + what);
    expect_nmse(dk, dk_ref, kv_reduction, "attention dk " + what);
    expect_nmse(dv, dv_ref, kv_reduction, "attention dv " + what);

    auto loss = [&] {
      forward(backend(), out, probs);
      return project(out.data(), dout);
    };
    if (T > 1)  // one token: the output is v, and q and k have zero gradient
      expect_close(check_all(q.data(), q.size(), dq.data(), kFdEps, loss), "dq " + what);
    if (T > 1) expect_close(check_all(k.data(), k.size(), dk.data(), kFdEps, loss), "dk " + what);
    expect_close(check_all(v.data(), v.size(), dv.data(), kFdEps, loss), "dv " + what);
  }
}

// The flash pair saves each query's logsumexp instead of the probabilities. Against the flash
// oracle in both precisions (bf16 rounds the same operands on both sides), and in fp32 against the
// causal oracle: its out and gradients, and the logsumexp its probabilities imply,
// lse_i = score_ij - log p_ij at the row's largest p_ij. On CausalAttentionMatchesReference's
// shapes: one token, GQA with odd sizes, more positions than one 64-row block, documents.
TEST_P(KernelOps, FlashAttentionMatchesCausalAttention) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().flash_attention_backward,
                                  backend().flash_attention_forward);
  // bf16 precision rounds P and dS, which each side computes itself (fp32 here, double in the
  // oracle): where the two straddle a bf16 rounding boundary they round one bf16 ulp apart, at
  // most 2^-7 relative. Such a term moves its output by at most 2^-7 of its size, so even with
  // every rounded term apart (and no cancellation) the NMSE stays below 2^-14 = 6.1e-5, added to
  // the bound of the outputs that multiply them; a wrong kernel gives 1e-2..1. Measured on the CPU
  // backend: 3.2e-12 at most (dq, documents), within nmse_bound alone.
  const double bf16_rounding_nmse = std::ldexp(1.0, -14);
  uint32_t seed = 1600;
  std::vector<std::pair<AttentionCase, bool>> cases;  // (case, bf16 only)
  for (const AttentionCase& c : kAttentionCases) cases.emplace_back(c, false);
  for (const AttentionCase& c : kBf16HeadDimCases) cases.emplace_back(c, true);
  for (const auto& [c, bf16_only] : cases) {
    const int64_t B = c.batch, T = c.seq, H = c.heads, KV = c.kv_heads, hd = c.head_dim;
    AttentionInputs in = attention_inputs(c, seed);
    const std::string& shape = in.what;
    std::vector<float>&q = in.q, &k = in.k, &v = in.v;
    const std::vector<float>& dout = in.dout;
    const ConstTensorView docs =
        c.documents ? view(in.doc_start.data(), {B, T}) : ConstTensorView{};
    const auto q_view = view(q.data(), {B, T, H, hd});
    const auto k_view = view(k.data(), {B, T, KV, hd});
    const auto v_view = view(v.data(), {B, T, KV, hd});
    const auto dout_view = view(dout.data(), {B, T, H, hd});
    // dk and dv sum over the T queries of every head of their group; dq, out and lse over the T
    // keys of products of hd terms.
    const int64_t q_reduction = T + hd, kv_reduction = (H / KV) * T + hd;

    // The causal oracle (fp32 only), and the logsumexp its probabilities imply.
    std::vector<float> out_causal(q.size()), probs(static_cast<size_t>(B * H * T * T));
    oracle().causal_attention_forward(
        q_view, k_view, v_view, view(out_causal.data(), {B, T, H, hd}),
        view(probs.data(), {B, H, T, T}), docs, kernels::MatmulPrecision::kFp32);
    std::vector<float> dq_causal(q.size()), dk_causal(k.size()), dv_causal(v.size());
    oracle().causal_attention_backward(
        dout_view, q_view, k_view, v_view, view(probs.data(), {B, H, T, T}),
        view(dq_causal.data(), {B, T, H, hd}), view(dk_causal.data(), {B, T, KV, hd}),
        view(dv_causal.data(), {B, T, KV, hd}), kernels::MatmulPrecision::kFp32);
    std::vector<float> lse_causal(static_cast<size_t>(B * H * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const float* p_row = probs.data() + ((b * H + h) * T + i) * T;
          const int64_t j = std::max_element(p_row, p_row + T) - p_row;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            dot += double{q[static_cast<size_t>(((b * T + i) * H + h) * hd + d)]} *
                   double{k[static_cast<size_t>(((b * T + j) * KV + h / (H / KV)) * hd + d)]};
          lse_causal[static_cast<size_t>((b * H + h) * T + i)] = static_cast<float>(
              dot / std::sqrt(static_cast<double>(hd)) - std::log(double{p_row[j]}));
        }

    for (const auto precision :
         {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
      const bool bf16 = precision == kernels::MatmulPrecision::kBf16;
      if (bf16_only && !bf16) continue;
      const std::string what = shape + (bf16 ? " bf16" : " fp32");
      // rounded: the outputs of products of operands the two sides round themselves (bf16 slack).
      auto expect_near = [&](const std::vector<float>& got, const std::vector<float>& ref,
                             int64_t reduction, const std::string& name, bool rounded) {
        const double err = nmse(got, ref);
        EXPECT_LE(err, nmse_bound(reduction) + (bf16 && rounded ? bf16_rounding_nmse : 0.0))
            << name << " " << what;
      };
      std::vector<float> out(q.size()), lse(static_cast<size_t>(B * H * T));
      std::vector<float> out_ref(out.size()), lse_ref(lse.size());
      auto forward = [&](const KernelBackend& b, std::vector<float>& o, std::vector<float>& l) {
        b.flash_attention_forward(q_view, k_view, v_view, view(o.data(), {B, T, H, hd}),
                                  view(l.data(), {B, H, T}), docs, precision);
      };
      forward(backend(), out, lse);
      forward(oracle(), out_ref, lse_ref);
      expect_near(out, out_ref, q_reduction, "flash out", true);
      // The scores' operands are inputs, rounded alike on both sides: no rounding slack needed.
      expect_near(lse, lse_ref, q_reduction, "flash lse", false);
      if (!bf16) {
        expect_near(out, out_causal, q_reduction, "flash vs causal out", false);
        expect_near(lse, lse_causal, q_reduction, "flash lse vs causal normaliser", false);
      }

      // Both backwards from the backend's forward, into gradients that start as NaN: they are
      // overwritten (=), so the model hands them unzeroed scratch.
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
      std::vector<float> dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
      auto backward = [&](const KernelBackend& b, std::vector<float>& gq, std::vector<float>& gk,
                          std::vector<float>& gv) {
        b.flash_attention_backward(
            dout_view, q_view, k_view, v_view, view(out.data(), {B, T, H, hd}),
            view(lse.data(), {B, H, T}), docs, view(gq.data(), {B, T, H, hd}),
            view(gk.data(), {B, T, KV, hd}), view(gv.data(), {B, T, KV, hd}), precision);
      };
      backward(backend(), dq, dk, dv);
      backward(oracle(), dq_ref, dk_ref, dv_ref);
      expect_near(dq, dq_ref, q_reduction, "flash dq", true);
      expect_near(dk, dk_ref, kv_reduction, "flash dk", true);
      expect_near(dv, dv_ref, kv_reduction, "flash dv", true);
      if (bf16) continue;  // the causal oracle is fp32 only; bf16 rounding is a step function
      expect_near(dq, dq_causal, q_reduction, "flash vs causal dq", false);
      expect_near(dk, dk_causal, kv_reduction, "flash vs causal dk", false);
      expect_near(dv, dv_causal, kv_reduction, "flash vs causal dv", false);

      auto loss = [&] {
        forward(backend(), out, lse);
        return project(out.data(), dout);
      };
      if (T > 1)  // one token: the output is v, and q and k have zero gradient
        expect_close(check_all(q.data(), q.size(), dq.data(), kFdEps, loss), "dq " + what);
      if (T > 1) expect_close(check_all(k.data(), k.size(), dk.data(), kFdEps, loss), "dk " + what);
      expect_close(check_all(v.data(), v.size(), dv.data(), kFdEps, loss), "dv " + what);
    }
  }
  std::vector<float> x(8), lse(2);
  EXPECT_THROW(backend().flash_attention_forward(
                   view(x.data(), {1, 2, 2, 2}), view(x.data(), {1, 2, 2, 2}),
                   view(x.data(), {1, 2, 2, 2}), view(x.data(), {1, 2, 2, 2}),
                   view(lse.data(), {1, 1, 2}), ConstTensorView{}, kernels::MatmulPrecision::kFp32),
               Error);
}

TEST_P(KernelOps, PermuteRowsMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().gather_rows, backend().permute_rows,
                                  backend().permute_rows_backward);
  uint32_t seed = 900;
  std::mt19937 gen(13);
  for (const auto [tokens, d] : kShapes)
    for (const int64_t k : {int64_t{1}, int64_t{3}}) {
      const int64_t routes = tokens * k, rows = routes + 2;  // two rows no route names
      const std::string what = "tokens=" + std::to_string(tokens) + " d=" + std::to_string(d) +
                               " k=" + std::to_string(k);
      std::vector<int32_t> order(static_cast<size_t>(rows));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), gen);
      const std::vector<int32_t> dst_row(order.begin(), order.begin() + routes);
      std::vector<float> src = random_vec(static_cast<size_t>(tokens * d), ++seed);
      const std::vector<float> before = random_vec(static_cast<size_t>(rows * d), ++seed);
      std::vector<float> dst = before, dst_ref = before;
      backend().permute_rows(view(src.data(), {tokens, d}), view(dst_row.data(), {routes}), k,
                             view(dst.data(), {rows, d}));
      oracle().permute_rows(view(src.data(), {tokens, d}), view(dst_row.data(), {routes}), k,
                            view(dst_ref.data(), {rows, d}));
      EXPECT_EQ(dst, dst_ref) << "permute_rows is a copy: " << what;
      std::vector<float> back(static_cast<size_t>(routes * d)), back_ref(back.size());
      backend().gather_rows(view(dst.data(), {rows, d}), view(dst_row.data(), {routes}),
                            view(back.data(), {routes, d}));
      oracle().gather_rows(view(dst.data(), {rows, d}), view(dst_row.data(), {routes}),
                           view(back_ref.data(), {routes, d}));
      EXPECT_EQ(back, back_ref) << "gather_rows is a copy: " << what;
      // Gathering what was permuted gives every source row k times.
      for (int64_t r = 0; r < routes; ++r)
        for (int64_t i = 0; i < d; ++i)
          ASSERT_EQ(back[static_cast<size_t>(r * d + i)],
                    src[static_cast<size_t>((r / k) * d + i)]);
      // Empty slots (-1) gather zeros, whatever the destination held.
      std::vector<int32_t> with_empty = dst_row;
      for (size_t r = 0; r < with_empty.size(); r += 2) with_empty[r] = -1;
      std::vector<float> padded = random_vec(back.size(), ++seed), padded_ref = padded;
      backend().gather_rows(view(dst.data(), {rows, d}), view(with_empty.data(), {routes}),
                            view(padded.data(), {routes, d}));
      oracle().gather_rows(view(dst.data(), {rows, d}), view(with_empty.data(), {routes}),
                           view(padded_ref.data(), {routes, d}));
      EXPECT_EQ(padded, padded_ref) << "gather_rows with empty slots: " << what;
      for (int64_t r = 0; r < routes; ++r)
        for (int64_t i = 0; i < d; ++i)
          ASSERT_EQ(padded[static_cast<size_t>(r * d + i)],
                    r % 2 == 0 ? 0.0f : src[static_cast<size_t>((r / k) * d + i)])
              << what;

      const std::vector<float> d_dst = random_vec(dst.size(), ++seed);
      std::vector<float> d_src(src.size()), d_src_ref(src.size());
      backend().permute_rows_backward(view(d_dst.data(), {rows, d}), view(dst_row.data(), {routes}),
                                      k, view(d_src.data(), {tokens, d}));
      oracle().permute_rows_backward(view(d_dst.data(), {rows, d}), view(dst_row.data(), {routes}),
                                     k, view(d_src_ref.data(), {tokens, d}));
      expect_nmse(d_src, d_src_ref, k, "permute_rows_backward " + what);
      auto loss = [&] {
        backend().permute_rows(view(src.data(), {tokens, d}), view(dst_row.data(), {routes}), k,
                               view(dst.data(), {rows, d}));
        return project(dst.data(), d_dst);
      };
      expect_close(check_all(src.data(), src.size(), d_src.data(), kFdEps, loss), "d_src " + what);
    }
  std::vector<float> x(4);
  const std::vector<int32_t> outside = {0, 2};
  EXPECT_THROW(backend().gather_rows(view(x.data(), {2, 2}), view(outside.data(), {2}),
                                     view(x.data(), {2, 2})),
               Error);
  const std::vector<int32_t> below_empty = {-2, 0};  // -1 is an empty slot; -2 is nothing
  EXPECT_THROW(backend().gather_rows(view(x.data(), {2, 2}), view(below_empty.data(), {2}),
                                     view(x.data(), {2, 2})),
               Error);
}

// The dispatch's send order (the model's local and sync dispatches call this op): routes sorted by
// expert, stably, against the oracle bit for bit.
TEST_P(KernelOps, OrderRoutesByExpertMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().order_routes_by_expert);
  struct Case {
    int64_t tokens, k, experts;
    bool every_expert;  // else experts e % 3 == 0 get no route (the first, and the last for E = 7)
  };
  // One token; k = 1 and k > 1; no tokens; experts not a power of two, more of them than a CUDA
  // block has threads (its scan of the counts takes chunks); more routes than one chunk.
  const std::vector<Case> cases = {{1, 1, 1, true},     {1, 4, 6, false},    {0, 2, 5, true},
                                   {37, 2, 7, false},   {700, 3, 300, true}, {700, 3, 300, false},
                                   {1000, 8, 64, true}, {5000, 1, 3, false}, {3, 2, 1000, true}};
  std::mt19937 gen(23);
  for (const auto& [tokens, k, experts, every_expert] : cases) {
    const int64_t routes = tokens * k;
    const std::string what = "tokens=" + std::to_string(tokens) + " k=" + std::to_string(k) +
                             " experts=" + std::to_string(experts);
    std::vector<int32_t> allowed;
    for (int32_t e = 0; e < experts; ++e)
      if (every_expert || experts < 3 || e % 3 != 0) allowed.push_back(e);
    std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
    std::vector<int32_t> index(static_cast<size_t>(routes));
    for (int32_t& e : index) e = allowed[pick(gen)];
    // Outputs start as values no route or offset takes: an element left unwritten shows.
    std::vector<int32_t> dst_row(index.size(), -7), dst_row_ref(index.size(), -7);
    std::vector<int64_t> offsets(static_cast<size_t>(experts + 1), -7), offsets_ref = offsets;
    backend().order_routes_by_expert(view(index.data(), {tokens, k}), experts,
                                     view(dst_row.data(), {routes}),
                                     view(offsets.data(), {experts + 1}));
    oracle().order_routes_by_expert(view(index.data(), {tokens, k}), experts,
                                    view(dst_row_ref.data(), {routes}),
                                    view(offsets_ref.data(), {experts + 1}));
    EXPECT_EQ(dst_row, dst_row_ref) << "dst_row " << what;
    EXPECT_EQ(offsets, offsets_ref) << "expert_offsets " << what;
    if (!every_expert && experts >= 3) {
      EXPECT_EQ(offsets_ref[1], offsets_ref[0]) << "expert 0 has no route: " << what;
    }
  }
  // An id outside [0, experts): an error where the backend checks ids (the oracle, the CPU); the
  // CUDA backend does not wait to check, and writes -1 for such a route, counted in no expert.
  const std::vector<int32_t> outside = {0, 2, 1, -1};
  std::vector<int32_t> dst_row(4, -7);
  std::vector<int64_t> offsets(3, -7);
  const auto call = [&](const KernelBackend& b) {
    b.order_routes_by_expert(view(outside.data(), {2, 2}), 2, view(dst_row.data(), {4}),
                             view(offsets.data(), {3}));
  };
  EXPECT_THROW(call(oracle()), Error);
  if (backend().name == "cuda") {
    call(backend());
    EXPECT_EQ(dst_row, (std::vector<int32_t>{0, -1, 1, -1}));
    EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 2}));
  } else {
    EXPECT_THROW(call(backend()), Error);
  }
  EXPECT_THROW(
      backend().order_routes_by_expert(view(outside.data(), {2, 2}), 2, view(dst_row.data(), {4}),
                                       view(offsets.data(), {2})),
      Error);
}

TEST_P(KernelOps, MoeCombineMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().moe_combine_backward, backend().moe_combine_forward);
  uint32_t seed = 1000;
  std::mt19937 gen(17);
  for (const auto [tokens, d] : kShapes)
    for (const int64_t k : {int64_t{1}, int64_t{4}}) {
      const int64_t routes = tokens * k;
      const std::string what = "tokens=" + std::to_string(tokens) + " d=" + std::to_string(d) +
                               " k=" + std::to_string(k);
      std::vector<int32_t> route_row(static_cast<size_t>(routes));
      std::iota(route_row.begin(), route_row.end(), 0);
      std::shuffle(route_row.begin(), route_row.end(), gen);
      std::vector<float> routed = random_vec(static_cast<size_t>(routes * d), ++seed);
      std::vector<float> weights = random_vec(route_row.size(), ++seed, 0.0f, 1.0f);
      const std::vector<float> y_before = random_vec(static_cast<size_t>(tokens * d), ++seed);
      const auto rows_view = view(route_row.data(), {tokens, k});
      std::vector<float> y = y_before, y_ref = y_before;
      backend().moe_combine_forward(view(routed.data(), {routes, d}), rows_view,
                                    view(weights.data(), {tokens, k}), view(y.data(), {tokens, d}));
      oracle().moe_combine_forward(view(routed.data(), {routes, d}), rows_view,
                                   view(weights.data(), {tokens, k}),
                                   view(y_ref.data(), {tokens, d}));
      expect_nmse(y, y_ref, k + 1, "moe_combine y " + what);

      const std::vector<float> dy = random_vec(y.size(), ++seed);
      std::vector<float> d_routed(routed.size()), d_routed_ref(routed.size());
      std::vector<float> d_weights(weights.size()), d_weights_ref(weights.size());
      backend().moe_combine_backward(view(dy.data(), {tokens, d}), view(routed.data(), {routes, d}),
                                     rows_view, view(weights.data(), {tokens, k}),
                                     view(d_routed.data(), {routes, d}),
                                     view(d_weights.data(), {tokens, k}));
      oracle().moe_combine_backward(view(dy.data(), {tokens, d}), view(routed.data(), {routes, d}),
                                    rows_view, view(weights.data(), {tokens, k}),
                                    view(d_routed_ref.data(), {routes, d}),
                                    view(d_weights_ref.data(), {tokens, k}));
      expect_nmse(d_routed, d_routed_ref, 1, "moe_combine d_routed " + what);
      expect_nmse(d_weights, d_weights_ref, d, "moe_combine d_weights " + what);
      auto loss = [&] {
        y = y_before;
        backend().moe_combine_forward(view(routed.data(), {routes, d}), rows_view,
                                      view(weights.data(), {tokens, k}),
                                      view(y.data(), {tokens, d}));
        return project(y.data(), dy);
      };
      expect_close(check_all(routed.data(), routed.size(), d_routed.data(), kFdEps, loss),
                   "d_routed " + what);
      expect_close(check_all(weights.data(), weights.size(), d_weights.data(), kFdEps, loss),
                   "d_weights " + what);
    }
}

// Router logits whose scores are far from ties: each token's logits are a random permutation of
// steps 1.0 apart (plus noise of +-0.1), so every score exceeds the sum of all smaller ones (e^-1
// ratios, a sigmoid's too below z = -1); top-k choices and group sums (sums of two) are then
// decided by margins far above the central differences' step, which must not change the choice.
std::vector<float> separated_logits(int64_t tokens, int64_t experts, float offset, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  std::vector<float> z(static_cast<size_t>(tokens * experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    for (int64_t e = 0; e < experts; ++e)
      z[static_cast<size_t>(t * experts + e)] =
          offset + static_cast<float>(order[static_cast<size_t>(e)]) + noise(gen);
  }
  return z;
}

// The padded all-to-all's index maps (the rowwise dispatch planned on the device): against the
// oracle, every map bit for bit, over group sizes, capacities that drop and that do not, k > 1,
// ranks without routes; tests/cpp/test_rowwise_plan.cpp checks the maps against the rowwise plan.
TEST_P(KernelOps, PaddedDispatchPlanMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().padded_dispatch_plan);
  std::mt19937 gen(31);
  struct Case {
    int64_t ranks, local, tokens, k;
    double factor;
  };
  const std::vector<Case> cases = {{1, 4, 9, 2, 1.0},  {2, 1, 16, 1, 0.5}, {2, 3, 13, 2, 1.25},
                                   {3, 2, 0, 2, 1.25}, {4, 2, 40, 4, 0.7}, {4, 8, 300, 8, 4.0},
                                   {8, 1, 64, 2, 1.0}};
  for (const Case& c : cases) {
    const int64_t experts = c.ranks * c.local, routes = c.tokens * c.k;
    const int64_t capacity =
        static_cast<int64_t>(std::ceil(c.factor * static_cast<double>(routes)));
    const int64_t block = std::min(capacity, routes), slots = c.ranks * block;
    // Every rank's routes (skewed towards expert 0), then its requests.
    std::vector<std::vector<int32_t>> index(static_cast<size_t>(c.ranks));
    std::vector<int64_t> requests(static_cast<size_t>(c.ranks * experts), 0);
    std::discrete_distribution<int32_t> pick = [&] {
      std::vector<double> weights(static_cast<size_t>(experts), 1.0);
      weights[0] = 6.0;
      return std::discrete_distribution<int32_t>(weights.begin(), weights.end());
    }();
    for (int64_t src = 0; src < c.ranks; ++src)
      for (int64_t r = 0; r < routes; ++r) {
        const int32_t e = pick(gen);
        index[static_cast<size_t>(src)].push_back(e);
        ++requests[static_cast<size_t>(src * experts + e)];
      }
    for (int64_t rank = 0; rank < c.ranks; ++rank) {
      const std::string what =
          "ranks=" + std::to_string(c.ranks) + " local=" + std::to_string(c.local) +
          " routes=" + std::to_string(routes) + " capacity=" + std::to_string(capacity) + " rank " +
          std::to_string(rank);
      std::vector<int32_t>& mine = index[static_cast<size_t>(rank)];
      std::vector<int32_t> order(mine.size());
      std::vector<int64_t> starts(static_cast<size_t>(experts + 1));
      oracle().order_routes_by_expert(view(mine.data(), {c.tokens, c.k}), experts,
                                      view(order.data(), {routes}),
                                      view(starts.data(), {experts + 1}));
      // Outputs start as values no map takes: an element left unwritten shows.
      struct Out {
        std::vector<int32_t> slot_of_position, position_of_slot, token_of_slot, row_of_slot,
            slot_of_row;
        std::vector<int64_t> offsets, dropped;
      };
      auto fresh = [&] {
        return Out{std::vector<int32_t>(static_cast<size_t>(routes), -7),
                   std::vector<int32_t>(static_cast<size_t>(slots), -7),
                   std::vector<int32_t>(static_cast<size_t>(slots), -7),
                   std::vector<int32_t>(static_cast<size_t>(slots), -7),
                   std::vector<int32_t>(static_cast<size_t>(capacity), -7),
                   std::vector<int64_t>(static_cast<size_t>(c.local + 1), -7),
                   std::vector<int64_t>(1, -7)};
      };
      Out got = fresh(), want = fresh();
      const PaddedDispatchShape shape{rank, c.ranks, c.local, capacity, block};
      auto run = [&](const KernelBackend& b, Out& o) {
        b.padded_dispatch_plan(
            view(requests.data(), {c.ranks, experts}), view(mine.data(), {c.tokens, c.k}),
            view(order.data(), {routes}), view(starts.data(), {experts + 1}), shape,
            {view(o.slot_of_position.data(), {routes}), view(o.position_of_slot.data(), {slots}),
             view(o.token_of_slot.data(), {slots}), view(o.row_of_slot.data(), {slots}),
             view(o.slot_of_row.data(), {capacity}), view(o.offsets.data(), {c.local + 1}),
             view(o.dropped.data(), {1})});
      };
      run(backend(), got);
      run(oracle(), want);
      EXPECT_EQ(got.slot_of_position, want.slot_of_position) << "slot_of_position " << what;
      EXPECT_EQ(got.position_of_slot, want.position_of_slot) << "position_of_slot " << what;
      EXPECT_EQ(got.token_of_slot, want.token_of_slot) << "token_of_slot " << what;
      EXPECT_EQ(got.row_of_slot, want.row_of_slot) << "row_of_slot " << what;
      EXPECT_EQ(got.slot_of_row, want.slot_of_row) << "slot_of_row " << what;
      EXPECT_EQ(got.offsets, want.offsets) << "expert_offsets " << what;
      EXPECT_EQ(got.dropped, want.dropped) << "dropped " << what;
    }
  }
  // Blocks smaller than a pair keeps: an error where the backend checks (the CUDA backend drops
  // such rows instead; the host sizes the blocks so that it cannot happen).
  if (backend().name != std::string_view("cuda")) {
    std::vector<int64_t> requests = {3, 0};  // one rank, three routes to expert 0
    std::vector<int32_t> index = {0, 0, 0}, order = {0, 1, 2}, slot_of_position(3), slot_of_row(3);
    std::vector<int32_t> position_of_slot(2), token_of_slot(2), row_of_slot(2);
    std::vector<int64_t> starts = {0, 3, 3}, offsets(3), dropped(1);
    EXPECT_THROW(
        backend().padded_dispatch_plan(
            view(requests.data(), {1, 2}), view(index.data(), {3, 1}), view(order.data(), {3}),
            view(starts.data(), {3}), {0, 1, 2, 3, 2},
            {view(slot_of_position.data(), {3}), view(position_of_slot.data(), {2}),
             view(token_of_slot.data(), {2}), view(row_of_slot.data(), {2}),
             view(slot_of_row.data(), {3}), view(offsets.data(), {3}), view(dropped.data(), {1})}),
        Error);
  }
}

TEST_P(KernelOps, RouterTopkMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().router_probability_column_sums,
                                  backend().router_topk_backward, backend().router_topk_forward,
                                  backend().router_z_loss);
  struct Case {
    int64_t experts;
    RouterTopkOptions options;
    bool bias;  // a selection bias of +2 on the odd experts, which then win every choice
    bool lb_uses_softmax;
  };
  using enum RouterScoreFunction;
  const std::vector<Case> cases = {
      {8, {.score = kSoftmax, .top_k = 2}, false, false},
      {8,
       {.score = kSoftmax, .top_k = 3, .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
       true,
       false},
      {8,
       {.score = kSigmoid, .top_k = 3, .norm_topk_prob = true, .n_group = 4, .topk_group = 2},
       true,
       false},
      {12, {.score = kSigmoid, .top_k = 2, .n_group = 3, .topk_group = 1}, false, true},
      {5, {.score = kTopkSoftmax, .top_k = 2, .routed_scaling_factor = 0.5f}, false, false},
      {7, {.score = kSigmoid, .top_k = 1}, false, false},
      {6,
       {.score = kSoftmax,
        .top_k = 2,
        .choice = RouterChoice::kRandom,
        .seed = 99,
        .token_offset = 5},
       false,
       false},
      {5,
       {.score = kSigmoid, .top_k = 3, .choice = RouterChoice::kBalanced, .token_offset = 3},
       false,
       false},
  };
  uint32_t seed = 1100;
  for (const Case& c : cases)
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}}) {
      const RouterTopkOptions& o = c.options;
      const int64_t e_count = c.experts, k = o.top_k;
      const std::string what = "E=" + std::to_string(e_count) + " k=" + std::to_string(k) +
                               " score=" + std::to_string(static_cast<int>(o.score)) +
                               " choice=" + std::to_string(static_cast<int>(o.choice)) +
                               " groups=" + std::to_string(o.n_group) + " N=" + std::to_string(n);
      const float offset = o.score == kSigmoid ? -1.5f - static_cast<float>(e_count) : -4.0f;
      std::vector<float> z = separated_logits(n, e_count, offset, ++seed);
      std::vector<float> bias(static_cast<size_t>(e_count));
      for (int64_t e = 0; e < e_count; ++e) bias[static_cast<size_t>(e)] = e % 2 == 1 ? 2.0f : 0.0f;
      const ConstTensorView bias_view = c.bias ? view(bias.data(), {e_count}) : ConstTensorView{};
      struct Out {
        std::vector<float> scores, weight;
        std::vector<int32_t> index;
        std::vector<int64_t> counts;
      };
      auto forward = [&](const KernelBackend& b, Out& out) {
        out.scores.resize(z.size());
        out.weight.resize(static_cast<size_t>(n * k));
        out.index.resize(out.weight.size());
        out.counts.resize(static_cast<size_t>(e_count));
        b.router_topk_forward(view(z.data(), {n, e_count}), bias_view, o,
                              view(out.scores.data(), {n, e_count}), view(out.index.data(), {n, k}),
                              view(out.weight.data(), {n, k}), view(out.counts.data(), {e_count}));
      };
      Out got, ref;
      forward(backend(), got);
      forward(oracle(), ref);
      EXPECT_EQ(got.index, ref.index) << "router top-k choice " << what;
      EXPECT_EQ(got.counts, ref.counts) << "router expert counts " << what;
      // Scores: one exp and a sum over the E experts; weights: a sum over k more.
      expect_nmse(got.scores, ref.scores, e_count, "router scores " + what);
      expect_nmse(got.weight, ref.weight, e_count + k, "router weights " + what);
      if (c.bias) {  // the +2 bias puts odd experts first whatever their scores
        for (int64_t t = 0; t < n; ++t)
          EXPECT_EQ(got.index[static_cast<size_t>(t * k)] % 2, 1) << what;
      }

      // The load-balancing probabilities and the z-loss.
      const RouterProbability lb_probability = o.score != kSigmoid ? RouterProbability::kScores
                                               : c.lb_uses_softmax
                                                   ? RouterProbability::kSoftmaxOfLogits
                                                   : RouterProbability::kScoresOverRowSum;
      for (const RouterProbability p :
           {RouterProbability::kScores, RouterProbability::kSoftmaxOfLogits,
            RouterProbability::kScoresOverRowSum}) {
        std::vector<double> sums(static_cast<size_t>(e_count)), sums_ref(sums.size());
        backend().router_probability_column_sums(view(z.data(), {n, e_count}),
                                                 view(got.scores.data(), {n, e_count}), p,
                                                 view(sums.data(), {e_count}));
        oracle().router_probability_column_sums(view(z.data(), {n, e_count}),
                                                view(got.scores.data(), {n, e_count}), p,
                                                view(sums_ref.data(), {e_count}));
        expect_nmse(std::vector<float>(sums.begin(), sums.end()),
                    std::vector<float>(sums_ref.begin(), sums_ref.end()), e_count + n,
                    "router column sums " + what);
      }
      double z_loss = 0.0, z_loss_ref = 0.0;
      backend().router_z_loss(view(z.data(), {n, e_count}), view(&z_loss, {1}));
      oracle().router_z_loss(view(z.data(), {n, e_count}), view(&z_loss_ref, {1}));
      EXPECT_LE(std::pow(z_loss - z_loss_ref, 2), nmse_bound(e_count) * z_loss_ref * z_loss_ref)
          << "router z-loss " << what;

      // Backward: d_weight, a load-balancing gradient and a z-loss scale, against the oracle and
      // against central differences of L = <weights, d_weight> + <lb, column sums of p> +
      // z_scale * N * z_loss, all through the backend's own forward ops.
      const std::vector<float> d_weight = random_vec(got.weight.size(), ++seed);
      const std::vector<float> lb = random_vec(static_cast<size_t>(e_count), ++seed);
      const float z_scale = 0.3f;
      const RouterLossGrads grads{view(lb.data(), {e_count}), c.lb_uses_softmax, z_scale};
      std::vector<float> dz(z.size()), dz_ref(z.size());
      auto backward = [&](const KernelBackend& b, const Out& out, std::vector<float>& g) {
        b.router_topk_backward(view(z.data(), {n, e_count}), view(out.scores.data(), {n, e_count}),
                               view(out.index.data(), {n, k}), view(out.weight.data(), {n, k}),
                               view(d_weight.data(), {n, k}), grads, o,
                               view(g.data(), {n, e_count}));
      };
      backward(backend(), got, dz);
      backward(oracle(), got, dz_ref);
      expect_nmse(dz, dz_ref, e_count + k, "router dlogits " + what);
      auto loss = [&] {
        Out out;
        forward(backend(), out);
        EXPECT_EQ(out.index, got.index) << "the step changed the choice: " << what;
        std::vector<double> sums(static_cast<size_t>(e_count));
        backend().router_probability_column_sums(view(z.data(), {n, e_count}),
                                                 view(out.scores.data(), {n, e_count}),
                                                 lb_probability, view(sums.data(), {e_count}));
        double total = project(out.weight.data(), d_weight);
        for (int64_t e = 0; e < e_count; ++e)
          total += double{lb[static_cast<size_t>(e)]} * sums[static_cast<size_t>(e)];
        double mean_lse2 = 0.0;
        backend().router_z_loss(view(z.data(), {n, e_count}), view(&mean_lse2, {1}));
        return total + double{z_scale} * static_cast<double>(n) * mean_lse2;
      };
      expect_close(check_all(z.data(), z.size(), dz.data(), kFdEps, loss), "dlogits " + what);
    }
  std::vector<float> z(6), scores(6), weight(2);
  std::vector<int32_t> index(2);
  std::vector<int64_t> counts(3);
  RouterTopkOptions too_many;
  too_many.top_k = 4;
  EXPECT_THROW(
      backend().router_topk_forward(view(z.data(), {2, 3}), ConstTensorView{}, too_many,
                                    view(scores.data(), {2, 3}), view(index.data(), {2, 1}),
                                    view(weight.data(), {2, 1}), view(counts.data(), {3})),
      Error);
}

// The load-balancing statistics and gradient per group of consecutive tokens (a micro-batch's
// instances, lb_loss_granularity "instance"): each group's row is what the backend gives for that
// group's tokens alone, bit for bit, and the whole matches the oracle and central differences.
TEST_P(KernelOps, RouterGroupStatisticsMatchReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().route_counts_by_group,
                                  backend().router_probability_column_sums,
                                  backend().router_topk_backward, backend().router_topk_forward);
  struct Case {
    int64_t experts;
    RouterTopkOptions options;
    bool lb_uses_softmax;
  };
  using enum RouterScoreFunction;
  const std::vector<Case> cases = {
      {8, {.score = kSoftmax, .top_k = 2}, false},
      {8, {.score = kSigmoid, .top_k = 3, .norm_topk_prob = true}, false},
      {6, {.score = kSigmoid, .top_k = 2}, true},
  };
  // (tokens, groups): small groups, and groups long enough that a backend sums each in several
  // chunks (the CUDA backend's are 64 rows).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {12, 1}, {12, 3}, {12, 4}, {320, 1}, {320, 2}};
  uint32_t seed = 2600;
  for (const Case& c : cases)
    for (const auto& [n, groups] : shapes) {
      const RouterTopkOptions& o = c.options;
      const int64_t e_count = c.experts, k = o.top_k, rows = n / groups;
      const std::string what = "E=" + std::to_string(e_count) + " k=" + std::to_string(k) +
                               " score=" + std::to_string(static_cast<int>(o.score)) +
                               " N=" + std::to_string(n) + " G=" + std::to_string(groups);
      const float offset = o.score == kSigmoid ? -1.5f - static_cast<float>(e_count) : -4.0f;
      std::vector<float> z = separated_logits(n, e_count, offset, ++seed);
      std::vector<float> scores(z.size()), weight(static_cast<size_t>(n * k));
      std::vector<int32_t> index(weight.size());
      std::vector<int64_t> counts(static_cast<size_t>(e_count));
      auto forward = [&] {
        backend().router_topk_forward(view(z.data(), {n, e_count}), ConstTensorView{}, o,
                                      view(scores.data(), {n, e_count}), view(index.data(), {n, k}),
                                      view(weight.data(), {n, k}), view(counts.data(), {e_count}));
      };
      forward();
      const std::vector<int32_t> chosen = index;
      const size_t values = static_cast<size_t>(groups * e_count);

      // Routes per expert and group: the oracle's, and the routes counted here.
      std::vector<int64_t> group_counts(values, -1), group_counts_ref(values, -2), by_hand(values);
      backend().route_counts_by_group(view(index.data(), {n, k}),
                                      view(group_counts.data(), {groups, e_count}));
      oracle().route_counts_by_group(view(index.data(), {n, k}),
                                     view(group_counts_ref.data(), {groups, e_count}));
      for (int64_t r = 0; r < n * k; ++r)
        ++by_hand[static_cast<size_t>(r / (rows * k) * e_count + index[static_cast<size_t>(r)])];
      EXPECT_EQ(group_counts, group_counts_ref) << what;
      EXPECT_EQ(group_counts, by_hand) << what;

      // Column sums per group: the oracle's, and each row the group's tokens' sums alone.
      const RouterProbability p = o.score != kSigmoid ? RouterProbability::kScores
                                  : c.lb_uses_softmax ? RouterProbability::kSoftmaxOfLogits
                                                      : RouterProbability::kScoresOverRowSum;
      std::vector<double> sums(values), sums_ref(values);
      backend().router_probability_column_sums(view(z.data(), {n, e_count}),
                                               view(scores.data(), {n, e_count}), p,
                                               view(sums.data(), {groups, e_count}));
      oracle().router_probability_column_sums(view(z.data(), {n, e_count}),
                                              view(scores.data(), {n, e_count}), p,
                                              view(sums_ref.data(), {groups, e_count}));
      expect_nmse(std::vector<float>(sums.begin(), sums.end()),
                  std::vector<float>(sums_ref.begin(), sums_ref.end()), e_count + rows,
                  "group column sums " + what);
      for (int64_t g = 0; g < groups; ++g) {
        std::vector<double> alone(static_cast<size_t>(e_count));
        backend().router_probability_column_sums(
            view(z.data() + g * rows * e_count, {rows, e_count}),
            view(scores.data() + g * rows * e_count, {rows, e_count}), p,
            view(alone.data(), {e_count}));
        EXPECT_EQ(std::vector<double>(sums.begin() + g * e_count, sums.begin() + (g + 1) * e_count),
                  alone)
            << what << " group " << g;
      }

      // Backward with a load-balancing row per group: the oracle's, each group's rows those of
      // the group alone with its row, and central differences of L = <weights, d_weight> +
      // sum_g <lb_g, group g's column sums> + z_scale * N * z_loss.
      const std::vector<float> d_weight = random_vec(weight.size(), ++seed);
      const std::vector<float> lb = random_vec(values, ++seed);
      const float z_scale = 0.3f;
      const RouterLossGrads grads{view(lb.data(), {groups, e_count}), c.lb_uses_softmax, z_scale};
      std::vector<float> dz(z.size()), dz_ref(z.size());
      backend().router_topk_backward(view(z.data(), {n, e_count}),
                                     view(scores.data(), {n, e_count}), view(index.data(), {n, k}),
                                     view(weight.data(), {n, k}), view(d_weight.data(), {n, k}),
                                     grads, o, view(dz.data(), {n, e_count}));
      oracle().router_topk_backward(view(z.data(), {n, e_count}), view(scores.data(), {n, e_count}),
                                    view(index.data(), {n, k}), view(weight.data(), {n, k}),
                                    view(d_weight.data(), {n, k}), grads, o,
                                    view(dz_ref.data(), {n, e_count}));
      expect_nmse(dz, dz_ref, e_count + k, "group router dlogits " + what);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t first = g * rows * e_count, first_route = g * rows * k;
        std::vector<float> alone(static_cast<size_t>(rows * e_count));
        backend().router_topk_backward(
            view(z.data() + first, {rows, e_count}), view(scores.data() + first, {rows, e_count}),
            view(index.data() + first_route, {rows, k}),
            view(weight.data() + first_route, {rows, k}),
            view(d_weight.data() + first_route, {rows, k}),
            {view(lb.data() + g * e_count, {e_count}), c.lb_uses_softmax, z_scale}, o,
            view(alone.data(), {rows, e_count}));
        EXPECT_EQ(std::vector<float>(dz.begin() + first, dz.begin() + first + rows * e_count),
                  alone)
            << what << " group " << g;
      }
      auto loss = [&] {
        forward();
        EXPECT_EQ(index, chosen) << "the step changed the choice: " << what;
        std::vector<double> stepped(values);
        backend().router_probability_column_sums(view(z.data(), {n, e_count}),
                                                 view(scores.data(), {n, e_count}), p,
                                                 view(stepped.data(), {groups, e_count}));
        double total = project(weight.data(), d_weight);
        for (size_t i = 0; i < values; ++i) total += double{lb[i]} * stepped[i];
        double mean_lse2 = 0.0;
        backend().router_z_loss(view(z.data(), {n, e_count}), view(&mean_lse2, {1}));
        return total + double{z_scale} * static_cast<double>(n) * mean_lse2;
      };
      expect_close(check_all(z.data(), z.size(), dz.data(), kFdEps, loss), "group dlogits " + what);
    }
  // Groups that do not divide the tokens are refused, naming the view.
  std::vector<float> z(24), scores(24), dz(24), lb(10), d_weight(12), weight(12);
  std::vector<int32_t> index(12);
  std::vector<int64_t> counts(20);
  std::vector<double> sums(20);
  EXPECT_THROW(
      backend().route_counts_by_group(view(index.data(), {6, 2}), view(counts.data(), {5, 4})),
      Error);
  EXPECT_THROW(backend().router_probability_column_sums(
                   view(z.data(), {6, 4}), view(scores.data(), {6, 4}), RouterProbability::kScores,
                   view(sums.data(), {4, 4})),
               Error);
  RouterTopkOptions two;
  two.top_k = 2;
  EXPECT_THROW(backend().router_topk_backward(
                   view(z.data(), {6, 4}), view(scores.data(), {6, 4}), view(index.data(), {6, 2}),
                   view(weight.data(), {6, 2}), view(d_weight.data(), {6, 2}),
                   {view(lb.data(), {5, 2}), false, 0.0f}, two, view(dz.data(), {6, 4})),
               Error);
}

TEST_P(KernelOps, GroupedGemmMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().grouped_gemm_backward, backend().grouped_gemm_forward);
  struct Case {
    std::vector<int64_t> rows_per_expert;  // empty experts included
    int64_t out, in;
    int64_t tail = 0;  // rows past the last expert's (a static-capacity buffer's)
  };
  // Odd sizes, an expert without rows at either end and in the middle, one expert, enough small
  // experts that the CPU backend runs them in parallel (kernels/cpu/grouped_gemm.cpp), and rows
  // past the experts' that nothing reads or writes.
  const std::vector<Case> cases = {{{3, 0, 5}, 7, 9},       {{1}, 1, 1},
                                   {{0, 17, 2, 0}, 16, 33}, {{4, 6, 1, 9, 3, 7, 2, 5}, 12, 10},
                                   {{2, 0, 3}, 5, 8, 4},    {{0, 0}, 3, 4, 2}};
  uint32_t seed = 1200;
  for (const Case& c : cases) {
    const int64_t experts = static_cast<int64_t>(c.rows_per_expert.size()), out = c.out, in = c.in;
    std::vector<int64_t> offsets = {0};
    for (const int64_t r : c.rows_per_expert) offsets.push_back(offsets.back() + r);
    const int64_t used_rows = offsets.back(), rows = used_rows + c.tail;
    const std::string what = "E=" + std::to_string(experts) + " R=" + std::to_string(rows) +
                             " out=" + std::to_string(out) + " in=" + std::to_string(in) +
                             " tail=" + std::to_string(c.tail);
    std::vector<float> x = random_vec(static_cast<size_t>(rows * in), ++seed);
    std::vector<float> w = random_vec(static_cast<size_t>(experts * out * in), ++seed);
    const std::vector<float> dy = random_vec(static_cast<size_t>(rows * out), ++seed);
    std::vector<float> y(dy.size()), y_ref(dy.size());
    backend().grouped_gemm_forward(view(x.data(), {rows, in}), view(w.data(), {experts, out, in}),
                                   offsets_view(offsets), view(y.data(), {rows, out}),
                                   kernels::MatmulPrecision::kFp32);
    oracle().grouped_gemm_forward(view(x.data(), {rows, in}), view(w.data(), {experts, out, in}),
                                  offsets_view(offsets), view(y_ref.data(), {rows, out}),
                                  kernels::MatmulPrecision::kFp32);
    expect_nmse(y, y_ref, in, "grouped_gemm y " + what);

    const std::vector<float> dw_before = random_vec(w.size(), ++seed);
    std::vector<float> dx(x.size()), dx_ref(x.size()), dw = dw_before, dw_ref = dw_before;
    backend().grouped_gemm_backward(
        view(dy.data(), {rows, out}), view(x.data(), {rows, in}),
        view(w.data(), {experts, out, in}), offsets_view(offsets), view(dx.data(), {rows, in}),
        view(dw.data(), {experts, out, in}), kernels::MatmulPrecision::kFp32);
    oracle().grouped_gemm_backward(
        view(dy.data(), {rows, out}), view(x.data(), {rows, in}),
        view(w.data(), {experts, out, in}), offsets_view(offsets), view(dx_ref.data(), {rows, in}),
        view(dw_ref.data(), {experts, out, in}), kernels::MatmulPrecision::kFp32);
    expect_nmse(dx, dx_ref, out, "grouped_gemm dx " + what);
    expect_nmse(dw, dw_ref, rows + 1, "grouped_gemm dw " + what);
    {  // Without dx (an empty view): the same weight gradient, bit for bit.
      std::vector<float> dw_only = dw_before;
      backend().grouped_gemm_backward(view(dy.data(), {rows, out}), view(x.data(), {rows, in}),
                                      view(w.data(), {experts, out, in}), offsets_view(offsets),
                                      TensorView(), view(dw_only.data(), {experts, out, in}),
                                      kernels::MatmulPrecision::kFp32);
      EXPECT_EQ(dw_only, dw) << "the weight gradient alone " << what;
    }
    if (c.tail > 0) {  // the tail's rows of y and dx are left as they were
      std::vector<float> y_kept(y.size(), 7.0f), dx_kept(dx.size(), 5.0f), dw_scratch = dw_before;
      backend().grouped_gemm_forward(view(x.data(), {rows, in}), view(w.data(), {experts, out, in}),
                                     offsets_view(offsets), view(y_kept.data(), {rows, out}),
                                     kernels::MatmulPrecision::kFp32);
      backend().grouped_gemm_backward(view(dy.data(), {rows, out}), view(x.data(), {rows, in}),
                                      view(w.data(), {experts, out, in}), offsets_view(offsets),
                                      view(dx_kept.data(), {rows, in}),
                                      view(dw_scratch.data(), {experts, out, in}),
                                      kernels::MatmulPrecision::kFp32);
      for (size_t i = static_cast<size_t>(used_rows * out); i < y_kept.size(); ++i)
        ASSERT_EQ(y_kept[i], 7.0f) << "y's tail " << what;
      for (size_t i = static_cast<size_t>(used_rows * in); i < dx_kept.size(); ++i)
        ASSERT_EQ(dx_kept[i], 5.0f) << "dx's tail " << what;
      EXPECT_EQ(dw_scratch, dw) << "the tail adds nothing to dw " << what;
    }
    // An expert without rows keeps its weight gradient as it was.
    for (int64_t e = 0; e < experts; ++e)
      if (offsets[static_cast<size_t>(e + 1)] == offsets[static_cast<size_t>(e)]) {
        for (int64_t i = e * out * in; i < (e + 1) * out * in; ++i)
          ASSERT_EQ(dw[static_cast<size_t>(i)], dw_before[static_cast<size_t>(i)]) << what;
      }
    if (used_rows == 0) continue;  // no expert has rows: no gradient to check
    auto loss = [&] {
      backend().grouped_gemm_forward(view(x.data(), {rows, in}), view(w.data(), {experts, out, in}),
                                     offsets_view(offsets), view(y.data(), {rows, out}),
                                     kernels::MatmulPrecision::kFp32);
      return project(y.data(), dy);
    };
    expect_close(check_all(x.data(), x.size(), dx.data(), kFdEps, loss), "dx " + what);
    const std::vector<float> gw = added(dw, dw_before);
    std::vector<size_t> used;  // the weights of experts with rows (the others have no gradient)
    for (int64_t e = 0; e < experts; ++e)
      if (offsets[static_cast<size_t>(e + 1)] > offsets[static_cast<size_t>(e)])
        for (int64_t i = e * out * in; i < (e + 1) * out * in; ++i)
          used.push_back(static_cast<size_t>(i));
    expect_close(gradcheck::check_indices(w.data(), gw.data(), used, kFdEps, loss), "dw " + what);
  }
  std::vector<float> x(6), w(6), y(6);
  const std::vector<int64_t> decreasing = {0, 2, 1};
  EXPECT_THROW(backend().grouped_gemm_forward(view(x.data(), {1, 3}), view(w.data(), {2, 1, 3}),
                                              offsets_view(decreasing), view(y.data(), {1, 1}),
                                              kernels::MatmulPrecision::kFp32),
               Error);
  const std::vector<int64_t> past_x = {0, 1, 2};  // x has 1 row
  EXPECT_THROW(backend().grouped_gemm_forward(view(x.data(), {1, 3}), view(w.data(), {2, 1, 3}),
                                              offsets_view(past_x), view(y.data(), {1, 1}),
                                              kernels::MatmulPrecision::kFp32),
               Error);
}

TEST_P(KernelOps, MatmulMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().matmul);
  struct Case {
    int64_t m, n, k;
  };
  uint32_t seed = 1300;
  for (const Case c : {Case{1, 1, 1}, Case{3, 5, 7}, Case{17, 33, 65}, Case{2, 64, 130}})
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true})
        for (const auto precision :
             {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
          const std::string what = "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                                   " k=" + std::to_string(c.k) + " ta=" + std::to_string(trans_a) +
                                   " tb=" + std::to_string(trans_b) +
                                   (precision == kernels::MatmulPrecision::kBf16 ? " bf16" : "");
          std::vector<float> a = random_vec(static_cast<size_t>(c.m * c.k), ++seed);
          std::vector<float> b = random_vec(static_cast<size_t>(c.k * c.n), ++seed);
          const std::vector<float> c_before = random_vec(static_cast<size_t>(c.m * c.n), ++seed);
          const auto a_view = trans_a ? view(a.data(), {c.k, c.m}) : view(a.data(), {c.m, c.k});
          const auto b_view = trans_b ? view(b.data(), {c.n, c.k}) : view(b.data(), {c.k, c.n});
          for (const float beta : {0.0f, 1.0f}) {
            std::vector<float> out = c_before, out_ref = c_before;
            backend().matmul(a_view, trans_a, b_view, trans_b, 0.5f, beta,
                             view(out.data(), {c.m, c.n}), precision);
            oracle().matmul(a_view, trans_a, b_view, trans_b, 0.5f, beta,
                            view(out_ref.data(), {c.m, c.n}), precision);
            expect_nmse(out, out_ref, c.k + 1, "matmul " + what);
          }
          // Gradient of L = <0.5 op(a) op(b), r> with respect to a: 0.5 r op(b)^T, laid out as a;
          // against finite differences in fp32 only (bf16 operand rounding is a step function).
          if (precision != kernels::MatmulPrecision::kFp32) continue;
          const std::vector<float> r = random_vec(c_before.size(), ++seed);
          std::vector<float> out(c_before.size()), da(a.size());
          if (trans_a)  // a is [K, M]: da = 0.5 op(b) r^T
            backend().matmul(b_view, trans_b, view(r.data(), {c.m, c.n}), true, 0.5f, 0.0f,
                             view(da.data(), {c.k, c.m}), precision);
          else
            backend().matmul(view(r.data(), {c.m, c.n}), false, b_view, !trans_b, 0.5f, 0.0f,
                             view(da.data(), {c.m, c.k}), precision);
          auto loss = [&] {
            backend().matmul(a_view, trans_a, b_view, trans_b, 0.5f, 0.0f,
                             view(out.data(), {c.m, c.n}), precision);
            return project(out.data(), r);
          };
          expect_close(check_all(a.data(), a.size(), da.data(), kFdEps, loss), "da " + what);
        }
  std::vector<float> x(6);
  EXPECT_THROW(backend().matmul(view(x.data(), {2, 3}), false, view(x.data(), {2, 3}), false, 1.0f,
                                0.0f, view(x.data(), {2, 3}), kernels::MatmulPrecision::kFp32),
               Error);
}

TEST_P(KernelOps, ToBf16MatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().to_bf16);
  uint32_t seed = 1350;
  // A SIMD tail, a partial last row of the threaded split, and special values.
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{3 * 4096 + 5}, int64_t{70001}}) {
    std::vector<float> x = random_vec(static_cast<size_t>(n), ++seed, -3.0f, 3.0f);
    const std::vector<float> special = {0.0f,
                                        -0.0f,
                                        std::numeric_limits<float>::infinity(),
                                        -std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::quiet_NaN(),
                                        std::numeric_limits<float>::max(),
                                        std::numeric_limits<float>::denorm_min(),
                                        std::bit_cast<float>(0x3f808000u),   // a tie: to even
                                        std::bit_cast<float>(0x3f818000u)};  // a tie: up
    for (size_t i = 0; i < special.size() && i < x.size(); ++i) x[i] = special[i];
    std::vector<uint16_t> bits(x.size()), bits_ref(x.size());
    backend().to_bf16(view(x.data(), {n}), TensorView(bits.data(), {n}, DType::kBf16));
    oracle().to_bf16(view(x.data(), {n}), TensorView(bits_ref.data(), {n}, DType::kBf16));
    EXPECT_EQ(bits, bits_ref) << "n=" << n;
  }
  std::vector<float> x(4);
  std::vector<float> not_bf16(4);
  EXPECT_THROW(backend().to_bf16(view(x.data(), {4}), view(not_bf16.data(), {4})), Error);
}

// A bf16 weight copy (to_bf16, made once per optimizer step) gives exactly the products of the
// fp32 weight in a bf16 GEMM, which rounds its operands the same way: in matmul (every transpose)
// and in both grouped GEMM passes; so does matmul's activation operand rounded once (to_bf16),
// with b in fp32 or as its copy. A bf16 operand in an fp32 GEMM is an error.
TEST_P(KernelOps, Bf16WeightCopyGivesTheProductsOfTheFp32Weight) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().grouped_gemm_backward, backend().grouped_gemm_forward,
                                  backend().matmul, backend().to_bf16);
  const auto bf16 = kernels::MatmulPrecision::kBf16;
  auto copy_of = [&](const std::vector<float>& w) {
    std::vector<uint16_t> bits(w.size());
    const auto n = static_cast<int64_t>(w.size());
    backend().to_bf16(view(w.data(), {n}), TensorView(bits.data(), {n}, DType::kBf16));
    return bits;
  };
  uint32_t seed = 1370;
  const int64_t m = 17, n = 33, k = 65;
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true}) {
      const std::vector<float> a = random_vec(static_cast<size_t>(m * k), ++seed);
      const std::vector<float> b = random_vec(static_cast<size_t>(k * n), ++seed);
      const std::vector<uint16_t> a16 = copy_of(a), b16 = copy_of(b);
      const auto a_view = trans_a ? view(a.data(), {k, m}) : view(a.data(), {m, k});
      const ConstTensorView a16_view(a16.data(), {a_view.size(0), a_view.size(1)}, DType::kBf16);
      const std::initializer_list<int64_t> b_shape = {trans_b ? n : k, trans_b ? k : n};
      const ConstTensorView b_view(b.data(), b_shape, DType::kF32);
      const ConstTensorView b16_view(b16.data(), b_shape, DType::kBf16);
      std::vector<float> from_fp32(static_cast<size_t>(m * n), 1.0f), from_copy = from_fp32;
      backend().matmul(a_view, trans_a, b_view, trans_b, 0.5f, 1.0f, view(from_fp32.data(), {m, n}),
                       bf16);
      backend().matmul(a_view, trans_a, b16_view, trans_b, 0.5f, 1.0f,
                       view(from_copy.data(), {m, n}), bf16);
      EXPECT_EQ(from_copy, from_fp32) << "matmul ta=" << trans_a << " tb=" << trans_b;
      for (const bool b_copy : {false, true}) {
        std::vector<float> from_rounded_a(static_cast<size_t>(m * n), 1.0f);
        backend().matmul(a16_view, trans_a, b_copy ? b16_view : b_view, trans_b, 0.5f, 1.0f,
                         view(from_rounded_a.data(), {m, n}), bf16);
        EXPECT_EQ(from_rounded_a, from_fp32)
            << "matmul, a in bf16, b " << (b_copy ? "bf16" : "fp32") << " ta=" << trans_a
            << " tb=" << trans_b;
      }
      std::vector<float> c(static_cast<size_t>(m * n));
      EXPECT_THROW(backend().matmul(a_view, trans_a, b16_view, trans_b, 1.0f, 0.0f,
                                    view(c.data(), {m, n}), kernels::MatmulPrecision::kFp32),
                   Error);
      EXPECT_THROW(backend().matmul(a16_view, trans_a, b_view, trans_b, 1.0f, 0.0f,
                                    view(c.data(), {m, n}), kernels::MatmulPrecision::kFp32),
                   Error);
    }
  const std::vector<int64_t> offsets = {0, 3, 3, 40, 41};  // an expert without rows
  const int64_t experts = 4, rows = 41, out = 12, in = 10;
  const std::vector<float> x = random_vec(static_cast<size_t>(rows * in), ++seed);
  const std::vector<float> w = random_vec(static_cast<size_t>(experts * out * in), ++seed);
  const std::vector<float> dy = random_vec(static_cast<size_t>(rows * out), ++seed);
  const std::vector<uint16_t> w16 = copy_of(w);
  const ConstTensorView w_view = view(w.data(), {experts, out, in});
  const ConstTensorView w16_view(w16.data(), {experts, out, in}, DType::kBf16);
  std::vector<float> y(dy.size()), y_copy(dy.size());
  backend().grouped_gemm_forward(view(x.data(), {rows, in}), w_view, offsets_view(offsets),
                                 view(y.data(), {rows, out}), bf16);
  backend().grouped_gemm_forward(view(x.data(), {rows, in}), w16_view, offsets_view(offsets),
                                 view(y_copy.data(), {rows, out}), bf16);
  EXPECT_EQ(y_copy, y) << "grouped_gemm forward";
  std::vector<float> dx(x.size()), dx_copy(x.size()), dw(w.size()), dw_copy(w.size());
  backend().grouped_gemm_backward(view(dy.data(), {rows, out}), view(x.data(), {rows, in}), w_view,
                                  offsets_view(offsets), view(dx.data(), {rows, in}),
                                  view(dw.data(), {experts, out, in}), bf16);
  backend().grouped_gemm_backward(view(dy.data(), {rows, out}), view(x.data(), {rows, in}),
                                  w16_view, offsets_view(offsets), view(dx_copy.data(), {rows, in}),
                                  view(dw_copy.data(), {experts, out, in}), bf16);
  EXPECT_EQ(dx_copy, dx) << "grouped_gemm dx";
  EXPECT_EQ(dw_copy, dw) << "grouped_gemm dw";
  EXPECT_THROW(
      backend().grouped_gemm_forward(view(x.data(), {rows, in}), w16_view, offsets_view(offsets),
                                     view(y.data(), {rows, out}), kernels::MatmulPrecision::kFp32),
      Error);
  // The activations in bf16 (as the experts keep theirs), with either weight: the same products.
  const std::vector<uint16_t> x16 = copy_of(x), dy16 = copy_of(dy);
  const ConstTensorView x16_view(x16.data(), {rows, in}, DType::kBf16);
  const ConstTensorView dy16_view(dy16.data(), {rows, out}, DType::kBf16);
  for (const ConstTensorView& weight : {w_view, w16_view}) {
    const std::string w_what = weight.dtype() == DType::kBf16 ? " w bf16" : " w fp32";
    std::vector<float> y16(y.size());
    backend().grouped_gemm_forward(x16_view, weight, offsets_view(offsets),
                                   view(y16.data(), {rows, out}), bf16);
    EXPECT_EQ(y16, y) << "grouped_gemm forward, x bf16" << w_what;
    for (const bool dy_bf16 : {false, true})
      for (const bool x_bf16 : {false, true}) {
        std::vector<float> dx16(x.size()), dw16(w.size());
        backend().grouped_gemm_backward(dy_bf16 ? dy16_view : view(dy.data(), {rows, out}),
                                        x_bf16 ? x16_view : view(x.data(), {rows, in}), weight,
                                        offsets_view(offsets), view(dx16.data(), {rows, in}),
                                        view(dw16.data(), {experts, out, in}), bf16);
        EXPECT_EQ(dx16, dx) << "grouped_gemm dx, dy bf16 " << dy_bf16 << w_what;
        EXPECT_EQ(dw16, dw) << "grouped_gemm dw, dy bf16 " << dy_bf16 << ", x bf16 " << x_bf16
                            << w_what;
      }
  }
  EXPECT_THROW(
      backend().grouped_gemm_forward(x16_view, w_view, offsets_view(offsets),
                                     view(y.data(), {rows, out}), kernels::MatmulPrecision::kFp32),
      Error);
  EXPECT_THROW(backend().grouped_gemm_backward(dy16_view, view(x.data(), {rows, in}), w_view,
                                               offsets_view(offsets), view(dx.data(), {rows, in}),
                                               view(dw.data(), {experts, out, in}),
                                               kernels::MatmulPrecision::kFp32),
               Error);
}

TEST_P(KernelOps, AddAndScaleMatchReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().add, backend().scale);
  uint32_t seed = 1400;
  // A SIMD tail, and enough elements for the threaded path.
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{70001}}) {
    const std::string what = "n=" + std::to_string(n);
    std::vector<float> a = random_vec(static_cast<size_t>(n), ++seed);
    const std::vector<float> b = random_vec(a.size(), ++seed);
    std::vector<float> sum(a.size()), sum_ref(a.size());
    backend().add(view(a.data(), {n}), view(b.data(), {n}), view(sum.data(), {n}));
    oracle().add(view(a.data(), {n}), view(b.data(), {n}), view(sum_ref.data(), {n}));
    // One fp32 rounding per element, the same on both sides.
    EXPECT_EQ(sum, sum_ref) << "add " << what;
    std::vector<float> in_place = a;  // the residual stream's form: out is a
    backend().add(view(in_place.data(), {n}), view(b.data(), {n}), view(in_place.data(), {n}));
    EXPECT_EQ(in_place, sum_ref) << "add in place " << what;
    std::vector<float> scaled(a.size()), scaled_ref(a.size());
    backend().scale(view(a.data(), {n}), 0.375f, view(scaled.data(), {n}));
    oracle().scale(view(a.data(), {n}), 0.375f, view(scaled_ref.data(), {n}));
    EXPECT_EQ(scaled, scaled_ref) << "scale " << what;
    // Both are linear: the gradient of <add(a, b), r> in a is r, of <scale(a), r> is 0.375 r.
    const std::vector<float> r = random_vec(a.size(), ++seed);
    std::vector<float> grad_scale(r.size());
    for (size_t i = 0; i < r.size(); ++i) grad_scale[i] = 0.375f * r[i];
    if (n <= 37) {
      auto add_loss = [&] {
        backend().add(view(a.data(), {n}), view(b.data(), {n}), view(sum.data(), {n}));
        return project(sum.data(), r);
      };
      expect_close(check_all(a.data(), a.size(), r.data(), kFdEps, add_loss), "add da " + what);
      auto scale_loss = [&] {
        backend().scale(view(a.data(), {n}), 0.375f, view(scaled.data(), {n}));
        return project(scaled.data(), r);
      };
      expect_close(check_all(a.data(), a.size(), grad_scale.data(), kFdEps, scale_loss),
                   "scale da " + what);
    }
  }
  std::vector<float> x(6);
  EXPECT_THROW(backend().add(view(x.data(), {6}), view(x.data(), {5}), view(x.data(), {6})), Error);
}

// Decoding attention over a cache has no backward (inference only); besides the oracle it must
// equal the training kernel's causal attention on the same positions.
TEST_P(KernelOps, CachedAttentionMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().cached_attention_forward);
  struct Case {
    int64_t first_position, n, heads, kv_heads, head_dim;
  };
  uint32_t seed = 1500;
  for (const Case c : {Case{0, 1, 1, 1, 1}, Case{4, 1, 4, 2, 3}, Case{0, 9, 3, 1, 5},
                       Case{6, 3, 2, 2, 17}, Case{0, 40, 4, 4, 32}}) {
    const int64_t keys = c.first_position + c.n, H = c.heads, KV = c.kv_heads, hd = c.head_dim;
    const std::string what = "p0=" + std::to_string(c.first_position) +
                             " n=" + std::to_string(c.n) + " H=" + std::to_string(H) +
                             " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd);
    // All positions' queries; the cached call sees the last n of them.
    const std::vector<float> q_all = random_vec(static_cast<size_t>(keys * H * hd), ++seed);
    const std::vector<float> k = random_vec(static_cast<size_t>(keys * KV * hd), ++seed);
    const std::vector<float> v = random_vec(k.size(), ++seed);
    const float* q = q_all.data() + c.first_position * H * hd;
    std::vector<float> out(static_cast<size_t>(c.n * H * hd)), out_ref(out.size());
    backend().cached_attention_forward(view(q, {c.n, H, hd}), view(k.data(), {keys, KV, hd}),
                                       view(v.data(), {keys, KV, hd}), c.first_position,
                                       view(out.data(), {c.n, H, hd}));
    oracle().cached_attention_forward(view(q, {c.n, H, hd}), view(k.data(), {keys, KV, hd}),
                                      view(v.data(), {keys, KV, hd}), c.first_position,
                                      view(out_ref.data(), {c.n, H, hd}));
    expect_nmse(out, out_ref, keys + hd, "cached_attention " + what);
    // And the same rows of the backend's own causal attention, where it has one (the CUDA
    // backend's training path is the flash pair).
    if (backend().causal_attention_forward == nullptr) continue;
    std::vector<float> full(q_all.size()), probs(static_cast<size_t>(H * keys * keys));
    backend().causal_attention_forward(
        view(q_all.data(), {1, keys, H, hd}), view(k.data(), {1, keys, KV, hd}),
        view(v.data(), {1, keys, KV, hd}), view(full.data(), {1, keys, H, hd}),
        view(probs.data(), {1, H, keys, keys}), ConstTensorView{}, kernels::MatmulPrecision::kFp32);
    const std::vector<float> tail(full.begin() + c.first_position * H * hd, full.end());
    expect_nmse(out, tail, keys + hd, "cached vs causal attention " + what);
  }
  std::vector<float> x(12);
  EXPECT_THROW(
      backend().cached_attention_forward(view(x.data(), {1, 3, 2}), view(x.data(), {1, 2, 2}),
                                         view(x.data(), {1, 2, 2}), 0, view(x.data(), {1, 3, 2})),
      Error);
}

// The step's decision: every backend gives the reference's bits (the host's guard must decide the
// same from the values it reads), the step applies when loss and norm are finite and at most
// their limits, clipping is torch's min(1, max / (norm + 1e-6)).
TEST_P(KernelOps, StepDecisionMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().step_decision);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    std::vector<double> rows;  // [m, kLossParts]
    std::array<double, 2> squares;
    StepDecisionOptions options;
    bool applies;
  };
  // Rows [ce, lb, z, lm_z]; options {max_grad_norm, loss_limit, norm_limit, lb_coef, z_coef,
  // lm_z_coef, loss_scale}.
  const std::vector<Case> cases = {
      {{2.5, 1.1, 9.0, 31.0, 2.4, 1.2, 8.5, 30.5},
       {3.0, 1.0},
       {1.0, inf, inf, 0.01, 0.001, 1e-4, 0.5},
       true},
      {{2.5, 1.1, 9.0, 31.0}, {0.04, 0.05}, {1.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, true},
      {{2.5, 1.1, 9.0, 31.0}, {3.0, 1.0}, {0.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, true},
      {{2.5, 1.1, 9.0, 31.0}, {3.0, 1.0}, {1.0, 2.0, inf, 0.01, 0.001, 1e-4, 1.0}, false},
      {{2.5, 1.1, 9.0, 31.0}, {3.0, 1.0}, {1.0, 3.0, 1.5, 0.01, 0.001, 1e-4, 1.0}, false},
      {{2.5, 1.1, 9.0, 31.0}, {3.0, 1.0}, {1.0, 2.5119, 2.0, 0.0, 0.0, 0.0, 1.0}, true},
      // The LM head's z-loss alone lifts the loss over its limit: 2.5 + 0.01 * 31 = 2.81.
      {{2.5, 0.0, 0.0, 31.0}, {3.0, 1.0}, {1.0, 2.8, inf, 0.01, 0.001, 0.01, 1.0}, false},
      {{nan, 1.1, 9.0, 31.0}, {3.0, 1.0}, {1.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, false},
      {{2.5, 1.1, 9.0, nan}, {3.0, 1.0}, {1.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, false},
      {{2.5, 1.1, 9.0, 31.0}, {inf, 1.0}, {1.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, false},
      {{}, {1.0, 0.0}, {1.0, inf, inf, 0.01, 0.001, 1e-4, 1.0}, true},  // no rows: loss 0
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const int64_t m = static_cast<int64_t>(c.rows.size() / kernels::kLossParts);
    std::array<double, 3> decision{}, decision_ref{};
    std::array<float, 2> factors{}, factors_ref{};
    backend().step_decision(view(c.rows.data(), {m, kernels::kLossParts}),
                            view(c.squares.data(), {2}), c.options, ConstTensorView(),
                            view(decision.data(), {3}), view(factors.data(), {2}));
    oracle().step_decision(view(c.rows.data(), {m, kernels::kLossParts}),
                           view(c.squares.data(), {2}), c.options, ConstTensorView(),
                           view(decision_ref.data(), {3}), view(factors_ref.data(), {2}));
    SCOPED_TRACE("case " + std::to_string(i));
    // The limits given as a tensor replace the options' (here limits that would skip any step).
    StepDecisionOptions replaced = c.options;
    replaced.loss_limit = replaced.norm_limit = -1.0;
    const std::array<double, 2> limits = {c.options.loss_limit, c.options.norm_limit};
    std::array<double, 3> decision_given{};
    std::array<float, 2> factors_given{};
    backend().step_decision(view(c.rows.data(), {m, kernels::kLossParts}),
                            view(c.squares.data(), {2}), replaced, view(limits.data(), {2}),
                            view(decision_given.data(), {3}), view(factors_given.data(), {2}));
    using Bits = std::array<uint64_t, 3>;
    EXPECT_EQ(std::bit_cast<Bits>(decision_given), std::bit_cast<Bits>(decision));
    EXPECT_EQ(factors_given, factors);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_TRUE(std::bit_cast<uint64_t>(decision[k]) == std::bit_cast<uint64_t>(decision_ref[k]))
          << k << ": " << decision[k] << " vs " << decision_ref[k];
    EXPECT_EQ(factors, factors_ref);
    EXPECT_EQ(decision_ref[2], c.applies ? 1.0 : 0.0);
    EXPECT_EQ(factors_ref[1], c.applies ? 1.0f : 0.0f);
    const double norm = std::sqrt(c.squares[0] + c.squares[1]);
    if (std::isfinite(norm)) {
      EXPECT_EQ(decision_ref[1], norm);
      const float clip =
          c.options.max_grad_norm > 0.0
              ? static_cast<float>(std::min(1.0, c.options.max_grad_norm / (norm + 1e-6)))
              : 1.0f;
      EXPECT_EQ(factors_ref[0], clip);
    }
  }
}

// AdamW with the step's coefficients and factors: the coefficients replace decay_factor,
// step_size and bias2_sqrt, the factors' coefficient replaces grad_scale (the same bits as passing
// them by value), and a skipped step leaves every view as it was.
TEST_P(KernelOps, AdamwReadsTheStepCoefficientsAndFactors) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().adamw_update, backend().router_bias_update);
  const int64_t n = 37;
  const std::vector<float> p0 = random_vec(n, 1), g = random_vec(n, 2),
                           m0 = random_vec(n, 3, -0.1f, 0.1f), v0 = random_vec(n, 4, 0.0f, 0.01f);
  AdamWCoefficients c{1.0f - 1e-4f, 0.9f, 0.95f, 0.3f, 1e-8f, 2e-3f, 0.25f};
  std::vector<float> p = p0, m = m0, v = v0, p_given = p0, m_given = m0, v_given = v0;
  backend().adamw_update(view(p_given.data(), {n}), view(g.data(), {n}), view(m_given.data(), {n}),
                         view(v_given.data(), {n}), c, TensorView(), TensorView());
  const std::array<float, kAdamWStepCoefficients> schedule = {c.decay_factor, c.step_size,
                                                              c.bias2_sqrt};
  const std::array<float, 2> apply = {0.25f, 1.0f}, skip = {0.25f, 0.0f};
  // What the tensors give replaces these.
  c.grad_scale = 1.0f;
  c.decay_factor = 0.5f;
  c.step_size = 1.0f;
  c.bias2_sqrt = 2.0f;
  backend().adamw_update(view(p.data(), {n}), view(g.data(), {n}), view(m.data(), {n}),
                         view(v.data(), {n}), c, view(schedule.data(), {kAdamWStepCoefficients}),
                         view(apply.data(), {2}));
  EXPECT_EQ(p, p_given);
  EXPECT_EQ(m, m_given);
  EXPECT_EQ(v, v_given);
  std::vector<float> p_skip = p0, m_skip = m0, v_skip = v0;
  backend().adamw_update(view(p_skip.data(), {n}), view(g.data(), {n}), view(m_skip.data(), {n}),
                         view(v_skip.data(), {n}), c,
                         view(schedule.data(), {kAdamWStepCoefficients}), view(skip.data(), {2}));
  EXPECT_EQ(p_skip, p0);
  EXPECT_EQ(m_skip, m0);
  EXPECT_EQ(v_skip, v0);
  // The selection bias moves only with an applied step.
  const std::vector<double> counts = {3.0, 1.0};
  std::vector<float> bias = {0.5f, 0.5f};
  backend().router_bias_update(view(counts.data(), {2}), 0.125f, view(skip.data(), {2}),
                               view(bias.data(), {2}));
  EXPECT_EQ(bias, (std::vector<float>{0.5f, 0.5f}));
  backend().router_bias_update(view(counts.data(), {2}), 0.125f, view(apply.data(), {2}),
                               view(bias.data(), {2}));
  EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.625f}));
}

// The losses from their statistics: every backend gives the reference's bits (one thread in its
// order: a run's logged losses and its routers' loss gradient must not depend on the device),
// for both load-balancing styles, chunks of the head, a tally added to, no MoE layer, and the
// cases where the router losses are 0 (no tokens, no counted label). Statistics that are sums
// over ranks of per-rank values: counts up to 4 x 512 routes, probability sums of random
// magnitude, mean lse^2 around 10.
TEST_P(KernelOps, MoeLossTermsMatchReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().moe_loss_terms);
  struct Case {
    int64_t layers, experts, head_chunks;
    MoeLossOptions options;
    bool tally;
  };
  const std::vector<Case> cases = {
      {3, 8, 1, {false, 2, 250.0, 256.0, 64.0, 0.01}, true},
      {2, 5, 3, {true, 1, 256.0, 256.0, 128.0, 0.02}, false},
      {1, 64, 0, {false, 8, 1000.0, 1024.0, 512.0, 0.001}, true},
      {0, 8, 2, {false, 2, 100.0, 128.0, 128.0, 0.01}, false},
      {2, 4, 1, {false, 2, 0.0, 128.0, 128.0, 0.01}, true},  // no counted label
      {2, 4, 1, {true, 2, 64.0, 0.0, 0.0, 0.01}, false},     // no tokens
  };
  std::mt19937 gen(4242);
  for (const Case& c : cases) {
    const int64_t l = c.layers, e = c.experts;
    const std::string what = "L=" + std::to_string(l) + " E=" + std::to_string(e) +
                             " C=" + std::to_string(c.head_chunks) +
                             (c.options.lb_over_all_layers ? " hf" : " olmo-core");
    std::vector<int64_t> counts(static_cast<size_t>(l * e));
    for (int64_t& n : counts) n = std::uniform_int_distribution<int64_t>(0, 2048)(gen);
    std::vector<double> sums(static_cast<size_t>(l * (e + 1)));
    for (double& x : sums) x = std::uniform_real_distribution<double>(0.0, 40.0)(gen);
    // Per chunk [ce, lm_z]: the cross-entropy's share and the LM head's z-loss's.
    std::vector<double> head(static_cast<size_t>(c.head_chunks * kernels::kHeadLosses));
    for (double& x : head) x = std::uniform_real_distribution<double>(0.5, 3.0)(gen);
    const std::vector<double> tally_before(static_cast<size_t>(l * e), 7.0);
    std::vector<double> losses(kernels::kLossParts, -1.0), losses_ref(kernels::kLossParts, -2.0);
    std::vector<float> grad(counts.size(), -1.0f), grad_ref(counts.size(), -2.0f);
    std::vector<double> tally = tally_before, tally_ref = tally_before;
    auto run = [&](const KernelBackend& b, std::vector<double>& out, std::vector<float>& g,
                   std::vector<double>& t) {
      b.moe_loss_terms(view(counts.data(), {l, e}), view(sums.data(), {l, e + 1}),
                       view(head.data(), {c.head_chunks, kernels::kHeadLosses}), c.options,
                       view(out.data(), {kernels::kLossParts}), view(g.data(), {l, e}),
                       c.tally ? view(t.data(), {l, e}) : TensorView());
    };
    run(backend(), losses, grad, tally);
    run(oracle(), losses_ref, grad_ref, tally_ref);
    EXPECT_EQ(losses, losses_ref) << what;
    EXPECT_EQ(grad, grad_ref) << what;
    EXPECT_EQ(tally, tally_ref) << what;
    // The rules themselves: ce and lm_z are the chunks' sums; the tally grew by the counts (or
    // was left).
    double ce = 0.0, lm_z = 0.0;
    for (int64_t k = 0; k < c.head_chunks; ++k) {
      ce += head[static_cast<size_t>(k * kernels::kHeadLosses + kernels::kHeadCe)];
      lm_z += head[static_cast<size_t>(k * kernels::kHeadLosses + kernels::kHeadZ)];
    }
    EXPECT_EQ(losses_ref[kernels::kCeLoss], ce) << what;
    EXPECT_EQ(losses_ref[kernels::kLmZLoss], lm_z) << what;
    for (size_t i = 0; i < counts.size(); ++i)
      EXPECT_EQ(tally_ref[i], c.tally ? 7.0 + static_cast<double>(counts[i]) : 7.0) << what;
    const bool router_losses = l > 0 && c.options.tokens > 0.0 && c.options.router_loss_div > 0.0;
    if (!router_losses) {
      EXPECT_EQ(losses_ref[1], 0.0) << what;
      EXPECT_EQ(losses_ref[2], 0.0) << what;
      for (const float g : grad_ref) EXPECT_EQ(g, 0.0f) << what;
      continue;
    }
    // z: each layer's mean lse^2 times its rows over the normaliser.
    double z = 0.0;
    for (int64_t j = 0; j < l; ++j)
      z +=
          sums[static_cast<size_t>(j * (e + 1) + e)] * c.options.z_rows / c.options.router_loss_div;
    EXPECT_NEAR(losses_ref[2], z, 1e-12 * z) << what;
    // The gradient check: lb is linear in each probability sum P[j][e] = sum_t p[t, e], so its
    // derivative, the gradient for every token's probability, is lb's change over a unit step
    // of that sum; lb_score_grad is aux_loss_coef times it, rounded to f32 (2^-24 relative).
    // The difference quotient's cancellation adds ~lb 2^-53 / derivative < 1e-12 here (lb < 1e3,
    // derivatives > 1e-3 or exactly 0); bound 1e-6 relative.
    for (int64_t j = 0; j < l; ++j)
      for (int64_t x = 0; x < e; x += std::max<int64_t>(1, e / 4)) {
        std::vector<double> stepped = sums;
        stepped[static_cast<size_t>(j * (e + 1) + x)] += 1.0;
        std::vector<double> out(kernels::kLossParts), t(counts.size());
        std::vector<float> g(counts.size());
        oracle().moe_loss_terms(view(counts.data(), {l, e}), view(stepped.data(), {l, e + 1}),
                                view(head.data(), {c.head_chunks, kernels::kHeadLosses}), c.options,
                                view(out.data(), {kernels::kLossParts}), view(g.data(), {l, e}),
                                TensorView());
        const double derivative = (out[1] - losses_ref[1]) * c.options.aux_loss_coef;
        EXPECT_NEAR(grad_ref[static_cast<size_t>(j * e + x)], derivative,
                    1e-6 * std::abs(derivative) + 1e-30)
            << what << " layer " << j << " expert " << x;
      }
  }
  // Bad views name the op and the argument.
  std::vector<int64_t> counts(8);
  std::vector<double> sums(10), losses(kernels::kLossParts);
  std::vector<float> grad(8);
  EXPECT_THROW(
      backend().moe_loss_terms(view(counts.data(), {2, 4}), view(sums.data(), {2, 4}),
                               view(sums.data(), {0, kernels::kHeadLosses}), MoeLossOptions{},
                               view(losses.data(), {kernels::kLossParts}),
                               view(grad.data(), {2, 4}), TensorView()),
      Error);
}

// The losses per group of tokens (lb_loss_granularity "instance"): the oracle's bits, each group's
// gradient row and loss that of the group on its own (one group of its tokens), the tally the
// groups' counts added, and the gradient the loss's derivative.
TEST_P(KernelOps, MoeLossTermsPerGroupMatchReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().moe_loss_terms);
  const int64_t l = 2, e = 4, groups = 3, row = groups * e;
  const MoeLossOptions options{.top_k = 2,
                               .router_loss_div = 30.0,
                               .tokens = 36.0,
                               .z_rows = 36.0,
                               .aux_loss_coef = 0.01,
                               .lb_groups = groups};
  std::mt19937 gen(5151);
  std::vector<int64_t> counts(static_cast<size_t>(l * row));
  for (int64_t& n : counts) n = std::uniform_int_distribution<int64_t>(0, 24)(gen);
  std::vector<double> sums(static_cast<size_t>(l * (row + 1)));
  for (double& x : sums) x = std::uniform_real_distribution<double>(0.0, 12.0)(gen);
  std::vector<double> head = {1.5, 0.25};
  auto run = [&](const KernelBackend& b, const MoeLossOptions& o, const std::vector<int64_t>& c,
                 const std::vector<double>& s, std::vector<double>& out, std::vector<float>& g,
                 std::vector<double>& t) {
    const int64_t values = static_cast<int64_t>(c.size()) / l;
    out.assign(kernels::kLossParts, -1.0);
    g.assign(c.size(), -1.0f);
    t.assign(static_cast<size_t>(l * e), 7.0);
    b.moe_loss_terms(view(c.data(), {l, values}), view(s.data(), {l, values + 1}),
                     view(head.data(), {1, kernels::kHeadLosses}), o,
                     view(out.data(), {kernels::kLossParts}), view(g.data(), {l, values}),
                     view(t.data(), {l, e}));
  };
  std::vector<double> losses, losses_ref, tally, tally_ref;
  std::vector<float> grad, grad_ref;
  run(backend(), options, counts, sums, losses, grad, tally);
  run(oracle(), options, counts, sums, losses_ref, grad_ref, tally_ref);
  EXPECT_EQ(losses, losses_ref);
  EXPECT_EQ(grad, grad_ref);
  EXPECT_EQ(tally, tally_ref);
  // Each group alone: its counts and sums (and the layer's z) as one group of 12 tokens.
  double lb_of_groups = 0.0;
  std::vector<double> tally_of_groups(static_cast<size_t>(l * e), 7.0);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> c(static_cast<size_t>(l * e));
    std::vector<double> s(static_cast<size_t>(l * (e + 1)));
    for (int64_t j = 0; j < l; ++j) {
      for (int64_t x = 0; x < e; ++x) {
        c[static_cast<size_t>(j * e + x)] = counts[static_cast<size_t>(j * row + g * e + x)];
        s[static_cast<size_t>(j * (e + 1) + x)] =
            sums[static_cast<size_t>(j * (row + 1) + g * e + x)];
        tally_of_groups[static_cast<size_t>(j * e + x)] +=
            static_cast<double>(c[static_cast<size_t>(j * e + x)]);
      }
      s[static_cast<size_t>(j * (e + 1) + e)] = sums[static_cast<size_t>(j * (row + 1) + row)];
    }
    MoeLossOptions alone = options;
    alone.tokens = options.tokens / groups;
    alone.lb_groups = 1;
    std::vector<double> out, t;
    std::vector<float> gr;
    run(oracle(), alone, c, s, out, gr, t);
    lb_of_groups += out[kernels::kLbLoss];
    for (int64_t j = 0; j < l; ++j)
      for (int64_t x = 0; x < e; ++x)
        EXPECT_EQ(grad_ref[static_cast<size_t>(j * row + g * e + x)],
                  gr[static_cast<size_t>(j * e + x)])
            << "layer " << j << " group " << g << " expert " << x;
  }
  EXPECT_NEAR(losses_ref[kernels::kLbLoss], lb_of_groups, 1e-12 * lb_of_groups);
  EXPECT_EQ(tally_ref, tally_of_groups);
  // The derivative of lb in each group's probability sum (as MoeLossTermsMatchReference).
  for (size_t i = 0; i < static_cast<size_t>(l * row); ++i) {
    std::vector<double> stepped = sums;
    stepped[i / row * (row + 1) + i % row] += 1.0;
    std::vector<double> out, t;
    std::vector<float> g;
    run(oracle(), options, counts, stepped, out, g, t);
    const double derivative = (out[kernels::kLbLoss] - losses_ref[kernels::kLbLoss]) * 0.01;
    EXPECT_NEAR(grad_ref[i], derivative, 1e-6 * std::abs(derivative) + 1e-30) << "value " << i;
  }
  // Rows that are not a row of experts per group, and groups with transformers' form.
  std::vector<float> g(10);
  std::vector<double> out(kernels::kLossParts), s(11);
  std::vector<int64_t> c(10);
  EXPECT_THROW(backend().moe_loss_terms(view(c.data(), {1, 10}), view(s.data(), {1, 11}),
                                        view(head.data(), {0, kernels::kHeadLosses}), options,
                                        view(out.data(), {kernels::kLossParts}),
                                        view(g.data(), {1, 10}), TensorView()),
               Error);
  MoeLossOptions hf = options;
  hf.lb_over_all_layers = true;
  hf.lb_groups = 2;
  EXPECT_THROW(backend().moe_loss_terms(view(c.data(), {1, 10}), view(s.data(), {1, 11}),
                                        view(head.data(), {0, kernels::kHeadLosses}), hf,
                                        view(out.data(), {kernels::kLossParts}),
                                        view(g.data(), {1, 10}), TensorView()),
               Error);
}

// OLMo-core's selection-bias step: + rate below the mean count, - rate above, nothing at it.
TEST_P(KernelOps, RouterBiasUpdateMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().router_bias_update);
  const std::vector<double> counts = {3.0, 1.0, 2.0, 2.0};  // mean 2
  std::vector<float> bias = {0.5f, -0.25f, 0.0f, 1.0f}, bias_ref = bias;
  backend().router_bias_update(view(counts.data(), {4}), 0.125f, TensorView(),
                               view(bias.data(), {4}));
  oracle().router_bias_update(view(counts.data(), {4}), 0.125f, TensorView(),
                              view(bias_ref.data(), {4}));
  EXPECT_EQ(bias, bias_ref);
  EXPECT_EQ(bias_ref, (std::vector<float>{0.375f, -0.125f, 0.0f, 1.0f}));
  uint32_t seed = 900;
  for (const int64_t e : {int64_t{1}, int64_t{7}, int64_t{128}}) {
    std::vector<double> random_counts(static_cast<size_t>(e));
    std::mt19937 gen(++seed);
    for (double& x : random_counts) x = std::uniform_int_distribution<int>(0, 9)(gen);
    std::vector<float> b = random_vec(static_cast<size_t>(e), ++seed), b_ref = b;
    backend().router_bias_update(view(random_counts.data(), {e}), 1e-3f, TensorView(),
                                 view(b.data(), {e}));
    oracle().router_bias_update(view(random_counts.data(), {e}), 1e-3f, TensorView(),
                                view(b_ref.data(), {e}));
    EXPECT_EQ(b, b_ref) << "E=" << e;
  }
}

TEST_P(KernelOps, RejectsMismatchedViews) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().embedding_forward, backend().rmsnorm_forward,
                                  backend().swiglu_forward);
  std::vector<float> x(12), y(12), w(4), rstd(3);
  EXPECT_THROW(backend().rmsnorm_forward(view(x.data(), {3, 4}), view(w.data(), {3}),
                                         view(y.data(), {3, 4}), view(rstd.data(), {3}), 1e-6f),
               Error);
  EXPECT_THROW(backend().swiglu_forward(view(x.data(), {3, 4}), view(y.data(), {3, 3})), Error);
  // A float view where token ids are expected names the dtype.
  EXPECT_THROW(backend().embedding_forward(view(x.data(), {3}), view(w.data(), {2, 2}),
                                           view(y.data(), {3, 2})),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelOps,
                         ::testing::ValuesIn(kernel_harness::registered_backends()), backend_name);

}  // namespace
}  // namespace moecore
