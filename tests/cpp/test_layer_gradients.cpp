// Finite-difference gradient checks of the dense primitives (rmsnorm, linear, embedding, swiglu,
// swiglu_mlp, cross_entropy): random inputs, L = sum(out * r), analytic backward vs central
// differences of the forward, plus the accumulate/overwrite rules of grad_rules.h.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/rope.h"
#include "model/swiglu_mlp.h"

namespace moecore {
namespace {

using gradcheck::added;
using gradcheck::check_all;
using gradcheck::expect_close;
using gradcheck::project;
using gradcheck::random_vec;

constexpr float kLayerFdEps = 1e-2f;

// rows x dim covers the plain per-token use and the per-head QK-norm use (rows = tokens * heads,
// dim = head_dim, one gain vector shared by every head).
void check_rmsnorm(int64_t rows, int64_t dim, bool accumulate_dx, uint32_t seed) {
  const size_t n = static_cast<size_t>(rows * dim);
  std::vector<float> x = random_vec(n, seed);
  std::vector<float> w = random_vec(static_cast<size_t>(dim), seed + 1, 0.5f, 1.5f);
  const std::vector<float> r = random_vec(n, seed + 2);
  const float norm_eps = 1e-5f;
  std::vector<float> y(n), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    kernels::rmsnorm_forward(view(x.data(), {rows, dim}), view(w.data(), {dim}),
                             view(y.data(), {rows, dim}), view(rstd.data(), {rows}), norm_eps);
    return project(y.data(), r);
  };
  loss();
  const std::vector<float> dx_before = random_vec(n, seed + 3);
  const std::vector<float> dw_before = random_vec(static_cast<size_t>(dim), seed + 4);
  std::vector<float> dx = dx_before, dw = dw_before;
  kernels::rmsnorm_backward(view(r.data(), {rows, dim}), view(x.data(), {rows, dim}),
                            view(w.data(), {dim}), view(rstd.data(), {rows}),
                            view(dx.data(), {rows, dim}), view(dw.data(), {dim}), accumulate_dx);
  const std::vector<float> gx = accumulate_dx ? added(dx, dx_before) : dx;
  const std::vector<float> gw = added(dw, dw_before);
  expect_close(check_all(x.data(), n, gx.data(), kLayerFdEps, loss), "rmsnorm dx");
  expect_close(check_all(w.data(), w.size(), gw.data(), kLayerFdEps, loss), "rmsnorm dw");
}

TEST(LayerGradients, RmsNormOverwriteDx) {
  check_rmsnorm(3, 8, false, 10);
}
TEST(LayerGradients, RmsNormAccumulateDx) {
  check_rmsnorm(3, 8, true, 20);
}
TEST(LayerGradients, RmsNormPerHeadRows) {
  // 2 tokens x 3 heads of head_dim 4.
  check_rmsnorm(6, 4, false, 30);
  check_rmsnorm(6, 4, true, 40);
}

void check_linear(bool accumulate_dx, uint32_t seed) {
  const int64_t rows = 4, in = 5, out = 3;
  std::vector<float> x = random_vec(static_cast<size_t>(rows * in), seed);
  std::vector<float> w = random_vec(static_cast<size_t>(out * in), seed + 1);
  const std::vector<float> r = random_vec(static_cast<size_t>(rows * out), seed + 2);
  std::vector<float> y(r.size());
  auto loss = [&] {
    linear_forward(kernels::MatmulPrecision::kFp32, x.data(), view(w.data(), {out, in}), y.data(),
                   rows, in, out);
    return project(y.data(), r);
  };
  const std::vector<float> dx_before = random_vec(x.size(), seed + 3);
  const std::vector<float> dw_before = random_vec(w.size(), seed + 4);
  std::vector<float> dx = dx_before, dw = dw_before;
  linear_backward(kernels::MatmulPrecision::kFp32, r.data(), x.data(), view(w.data(), {out, in}),
                  dx.data(), dw.data(), rows, in, out, accumulate_dx);
  const std::vector<float> gx = accumulate_dx ? added(dx, dx_before) : dx;
  const std::vector<float> gw = added(dw, dw_before);
  expect_close(check_all(x.data(), x.size(), gx.data(), kLayerFdEps, loss), "linear dx");
  expect_close(check_all(w.data(), w.size(), gw.data(), kLayerFdEps, loss), "linear dw");
}

TEST(LayerGradients, LinearOverwriteDx) {
  check_linear(false, 50);
}
TEST(LayerGradients, LinearAccumulateDx) {
  check_linear(true, 60);
}

TEST(LayerGradients, EmbeddingRepeatedTokensAccumulate) {
  const int64_t vocab = 6, dim = 4;
  const std::vector<int32_t> tokens = {2, 0, 2, 3, 2, 0};
  const int64_t rows = static_cast<int64_t>(tokens.size());
  std::vector<float> w = random_vec(static_cast<size_t>(vocab * dim), 70);
  const std::vector<float> r = random_vec(static_cast<size_t>(rows * dim), 71);
  std::vector<float> out(r.size());
  auto loss = [&] {
    kernels::embedding_forward(view(tokens.data(), {rows}), view(w.data(), {vocab, dim}),
                               view(out.data(), {rows, dim}));
    return project(out.data(), r);
  };
  loss();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < dim; ++i)
      EXPECT_EQ(out[static_cast<size_t>(t * dim + i)],
                w[static_cast<size_t>(tokens[static_cast<size_t>(t)] * dim + i)]);
  const std::vector<float> dw_before = random_vec(w.size(), 72);
  std::vector<float> dw = dw_before;
  kernels::embedding_backward(view(tokens.data(), {rows}), view(r.data(), {rows, dim}),
                              view(dw.data(), {vocab, dim}), -1);
  const std::vector<float> gw = added(dw, dw_before);
  expect_close(check_all(w.data(), w.size(), gw.data(), kLayerFdEps, loss), "embedding dw");
  // Unused rows (1, 4, 5) are untouched.
  for (int64_t v : {1, 4, 5})
    for (int64_t i = 0; i < dim; ++i)
      EXPECT_EQ(dw[static_cast<size_t>(v * dim + i)], dw_before[static_cast<size_t>(v * dim + i)]);
}

TEST(LayerGradients, Swiglu) {
  const int64_t rows = 3, hidden = 5;
  std::vector<float> gu = random_vec(static_cast<size_t>(rows * 2 * hidden), 80, -2.0f, 2.0f);
  const std::vector<float> r = random_vec(static_cast<size_t>(rows * hidden), 81);
  std::vector<float> act(r.size());
  auto loss = [&] {
    kernels::swiglu_forward(view(gu.data(), {rows, 2 * hidden}), view(act.data(), {rows, hidden}));
    return project(act.data(), r);
  };
  loss();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < hidden; ++i) {
      const double g = gu[static_cast<size_t>(t * 2 * hidden + i)];
      const double u = gu[static_cast<size_t>(t * 2 * hidden + hidden + i)];
      // fp32 vs double of one element (|g|, |u| <= 1): a few ulps (measured 8.9e-8).
      EXPECT_NEAR(act[static_cast<size_t>(t * hidden + i)], g / (1.0 + std::exp(-g)) * u, 1e-6);
    }
  std::vector<float> dgu(gu.size(), 7.0f);  // overwritten
  kernels::swiglu_backward(view(r.data(), {rows, hidden}), view(gu.data(), {rows, 2 * hidden}),
                           view(dgu.data(), {rows, 2 * hidden}));
  expect_close(check_all(gu.data(), gu.size(), dgu.data(), kLayerFdEps, loss), "swiglu dgu");
}

void check_swiglu_mlp(bool accumulate_dx, uint32_t seed) {
  const SwigluShape s{3, 4, 5};
  std::vector<float> x = random_vec(static_cast<size_t>(s.rows * s.dim), seed);
  std::vector<float> wgu = random_vec(static_cast<size_t>(2 * s.hidden * s.dim), seed + 1);
  std::vector<float> wd = random_vec(static_cast<size_t>(s.dim * s.hidden), seed + 2);
  const ConstTensorView w_gate_up = view(wgu.data(), {2 * s.hidden, s.dim});
  const ConstTensorView w_down = view(wd.data(), {s.dim, s.hidden});
  const std::vector<float> r = random_vec(x.size(), seed + 3);
  std::vector<float> gu(static_cast<size_t>(s.rows * 2 * s.hidden));
  std::vector<float> act(static_cast<size_t>(s.rows * s.hidden)), y(x.size());
  auto loss = [&] {
    swiglu_mlp_forward(kernels::MatmulPrecision::kFp32, s, x.data(), w_gate_up, w_down, gu.data(),
                       view(act.data(), {s.rows, s.hidden}), y.data());
    return project(y.data(), r);
  };
  loss();
  const std::vector<float> dx_before = random_vec(x.size(), seed + 4);
  const std::vector<float> dwgu_before = random_vec(wgu.size(), seed + 5);
  const std::vector<float> dwd_before = random_vec(wd.size(), seed + 6);
  std::vector<float> dx = dx_before, dwgu = dwgu_before, dwd = dwd_before;
  std::vector<float> scratch_dact(act.size()), scratch_dgu(gu.size());
  swiglu_mlp_backward(kernels::MatmulPrecision::kFp32, s, r.data(), x.data(), w_gate_up, w_down,
                      gu.data(), view(act.data(), {s.rows, s.hidden}), dx.data(), dwgu.data(),
                      dwd.data(), scratch_dact.data(),
                      view(scratch_dgu.data(), {s.rows, 2 * s.hidden}), accumulate_dx);
  const std::vector<float> gx = accumulate_dx ? added(dx, dx_before) : dx;
  const std::vector<float> ggu = added(dwgu, dwgu_before), gd = added(dwd, dwd_before);
  expect_close(check_all(x.data(), x.size(), gx.data(), kLayerFdEps, loss), "swiglu_mlp dx");
  expect_close(check_all(wgu.data(), wgu.size(), ggu.data(), kLayerFdEps, loss),
               "swiglu_mlp dw_gate_up");
  expect_close(check_all(wd.data(), wd.size(), gd.data(), kLayerFdEps, loss), "swiglu_mlp dw_down");
}

TEST(LayerGradients, SwigluMlpOverwriteDx) {
  check_swiglu_mlp(false, 90);
}
TEST(LayerGradients, SwigluMlpAccumulateDx) {
  check_swiglu_mlp(true, 100);
}

// In bf16 the MLP keeps its SwiGLU output, and writes that output's gradient, as bf16 bits
// (kept_mlp_act_dtype): its GEMMs then read the rounding they made of the fp32 values before, so
// the outputs and gradients are those of the fp32 act and dgu to the bit, on the native path
// (bf16 GEMMs on the bits) and the emulated one (Numerics.Avx2Kernels: the bits widened). A bf16
// act in an fp32 GEMM is an error.
TEST(LayerGradients, SwigluMlpBf16ActGivesTheFp32ActsProducts) {
  const SwigluShape s{37, 24, 40};
  const std::vector<float> x = random_vec(static_cast<size_t>(s.rows * s.dim), 110);
  const std::vector<float> dy = random_vec(x.size(), 111);
  const std::vector<float> wgu = random_vec(static_cast<size_t>(2 * s.hidden * s.dim), 112);
  const std::vector<float> wd = random_vec(static_cast<size_t>(s.dim * s.hidden), 113);
  const ConstTensorView w_gate_up = view(wgu.data(), {2 * s.hidden, s.dim});
  const ConstTensorView w_down = view(wd.data(), {s.dim, s.hidden});
  struct Pass {
    std::vector<float> y, dx, dwgu, dwd;
  };
  auto run = [&](DType act_type) {
    const size_t width = dtype_size(act_type);
    std::vector<float> gu(static_cast<size_t>(s.rows * 2 * s.hidden));
    std::vector<std::byte> act(static_cast<size_t>(s.rows * s.hidden) * width),
        dgu(gu.size() * width);
    std::vector<float> dact(static_cast<size_t>(s.rows * s.hidden));
    Pass p{std::vector<float>(x.size()), std::vector<float>(x.size()),
           std::vector<float>(wgu.size()), std::vector<float>(wd.size())};
    swiglu_mlp_forward(kernels::MatmulPrecision::kBf16, s, x.data(), w_gate_up, w_down, gu.data(),
                       TensorView(act.data(), {s.rows, s.hidden}, act_type), p.y.data());
    swiglu_mlp_backward(kernels::MatmulPrecision::kBf16, s, dy.data(), x.data(), w_gate_up, w_down,
                        gu.data(), ConstTensorView(act.data(), {s.rows, s.hidden}, act_type),
                        p.dx.data(), p.dwgu.data(), p.dwd.data(), dact.data(),
                        TensorView(dgu.data(), {s.rows, 2 * s.hidden}, act_type), false);
    return p;
  };
  const Pass fp32 = run(DType::kF32), bf16 = run(DType::kBf16);
  EXPECT_EQ(bf16.y, fp32.y);
  EXPECT_EQ(bf16.dx, fp32.dx);
  EXPECT_EQ(bf16.dwgu, fp32.dwgu);
  EXPECT_EQ(bf16.dwd, fp32.dwd);

  std::vector<float> gu(static_cast<size_t>(s.rows * 2 * s.hidden)), y(x.size());
  std::vector<uint16_t> act(static_cast<size_t>(s.rows * s.hidden));
  try {
    swiglu_mlp_forward(kernels::MatmulPrecision::kFp32, s, x.data(), w_gate_up, w_down, gu.data(),
                       TensorView(act.data(), {s.rows, s.hidden}, DType::kBf16), y.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[swiglu_mlp]"), std::string::npos) << e.what();
  }
}

// Double reference: the means over counted rows of logsumexp(z) - z[target] and of
// logsumexp(z)^2 (the LM head's z-loss).
std::array<double, 2> reference_cross_entropy(const std::vector<float>& logits,
                                              const std::vector<int32_t>& t, int64_t vocab) {
  double total = 0.0, total_z = 0.0;
  int64_t counted = 0;
  for (size_t row = 0; row < t.size(); ++row) {
    if (t[row] == kIgnoreIndex) continue;
    const float* z = logits.data() + row * static_cast<size_t>(vocab);
    double mx = -1e300;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(z[j]));
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(z[j]) - mx);
    const double lse = mx + std::log(sum);
    total += lse - static_cast<double>(z[t[row]]);
    total_z += lse * lse;
    ++counted;
  }
  if (counted == 0) return {0.0, 0.0};
  return {total / static_cast<double>(counted), total_z / static_cast<double>(counted)};
}

TEST(LayerGradients, CrossEntropyWithIgnoredRows) {
  const int64_t rows = 5, vocab = 7;
  const std::vector<int32_t> targets = {3, kIgnoreIndex, 0, 6, kIgnoreIndex};
  std::vector<float> logits = random_vec(static_cast<size_t>(rows * vocab), 110, -2.0f, 2.0f);
  const float scale = 1.5f;
  // Without and with the LM head's z-loss (0.2: 2 * 0.2 * lse ~ 1, the cross-entropy's size).
  for (const float z_coef : {0.0f, 0.2f}) {
    SCOPED_TRACE("z_coef " + std::to_string(z_coef));
    auto loss = [&] {
      double means[kernels::kHeadLosses] = {};
      kernels::cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                             TensorView{}, scale, z_coef, ConstTensorView(),
                             view(means, {kernels::kHeadLosses}));
      return static_cast<double>(scale) *
             (means[kernels::kHeadCe] + static_cast<double>(z_coef) * means[kernels::kHeadZ]);
    };
    std::vector<float> dlogits(logits.size(), 7.0f);  // overwritten, ignored rows included
    double means[kernels::kHeadLosses] = {};
    kernels::cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                           view(dlogits.data(), {rows, vocab}), scale, z_coef, ConstTensorView(),
                           view(means, {kernels::kHeadLosses}));
    // fp32 logsumexp: a few ulps of the per-row loss (~2) and of its square (~4, the square
    // doubling the relative error), over the 3 counted rows.
    const std::array<double, 2> ref = reference_cross_entropy(logits, targets, vocab);
    EXPECT_NEAR(means[kernels::kHeadCe], ref[0], 1e-6);
    EXPECT_NEAR(means[kernels::kHeadZ], ref[1], 4e-6);
    expect_close(check_all(logits.data(), logits.size(), dlogits.data(), 1e-3f, loss),
                 "cross_entropy dlogits");
    for (int64_t row : {1, 4})
      for (int64_t j = 0; j < vocab; ++j)
        EXPECT_EQ(dlogits[static_cast<size_t>(row * vocab + j)], 0.0f);
    // Each counted row's gradient sums to scale 2 z_coef lse / counted: softmax minus one-hot
    // sums to zero, the z-loss's 2 z_coef lse softmax to 2 z_coef lse. 7 fp32 terms of size
    // <= 1.5 * 1.6: a few ulps (~1e-7); bound 1e-6.
    for (int64_t row : {0, 2, 3}) {
      double sum = 0.0, mx = -1e300, exps = 0.0;
      for (int64_t j = 0; j < vocab; ++j) {
        sum += static_cast<double>(dlogits[static_cast<size_t>(row * vocab + j)]);
        mx = std::max(mx, static_cast<double>(logits[static_cast<size_t>(row * vocab + j)]));
      }
      for (int64_t j = 0; j < vocab; ++j)
        exps += std::exp(static_cast<double>(logits[static_cast<size_t>(row * vocab + j)]) - mx);
      const double lse = mx + std::log(exps);
      EXPECT_NEAR(sum, static_cast<double>(scale) * 2.0 * static_cast<double>(z_coef) * lse / 3.0,
                  1e-6);
    }
  }
}

TEST(LayerGradients, CrossEntropyAllIgnoredIsZero) {
  const int64_t rows = 3, vocab = 4;
  const std::vector<int32_t> targets(static_cast<size_t>(rows), kIgnoreIndex);
  const std::vector<float> logits = random_vec(static_cast<size_t>(rows * vocab), 120);
  std::vector<float> dlogits(logits.size(), 7.0f);
  double means[kernels::kHeadLosses] = {1.0, 1.0};  // overwritten
  kernels::cross_entropy(view(logits.data(), {rows, vocab}), view(targets.data(), {rows}),
                         view(dlogits.data(), {rows, vocab}), 1.0f, 0.5f, ConstTensorView(),
                         view(means, {kernels::kHeadLosses}));
  EXPECT_EQ(means[kernels::kHeadCe], 0.0);
  EXPECT_EQ(means[kernels::kHeadZ], 0.0);
  for (float g : dlogits) EXPECT_EQ(g, 0.0f);
}

// AttentionBlock (q/k/v projections, QK-norm, RoPE, causal GQA attention, o_proj): gradients wrt
// x and every weight for each QK-norm mode, with MHA and GQA head layouts.
void check_attention(QkNorm qk_norm, int64_t kv_heads, uint32_t seed) {
  ModelConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.qk_norm = qk_norm;
  const int64_t batch = 2, seq = 3, n = batch * seq, d = c.hidden_size;
  const size_t qs = static_cast<size_t>(c.q_size()), kvs = static_cast<size_t>(c.kv_size());
  const size_t dd = static_cast<size_t>(d);
  const RopeTable rope = RopeTable::build(seq, c.head_size(), c.rope_theta);
  const AttentionBlock block(c, rope);
  const size_t qn = qk_norm == QkNorm::kFull ? qs : static_cast<size_t>(c.head_size());
  const size_t kn = qk_norm == QkNorm::kFull ? kvs : static_cast<size_t>(c.head_size());
  std::vector<float> x = random_vec(static_cast<size_t>(n * d), seed);
  std::vector<std::vector<float>> w = {
      random_vec(qs * dd, seed + 1),        random_vec(kvs * dd, seed + 2),
      random_vec(kvs * dd, seed + 3),       random_vec(dd * qs, seed + 4),
      random_vec(qn, seed + 5, 0.5f, 1.5f), random_vec(kn, seed + 6, 0.5f, 1.5f)};
  const bool has_norm = qk_norm != QkNorm::kNone;
  const auto q = static_cast<int64_t>(qs), kv = static_cast<int64_t>(kvs);
  auto weights = [&](const std::vector<std::vector<float>>& v) {
    return AttentionWeights{view(v[0].data(), {q, d}),        view(v[1].data(), {kv, d}),
                            view(v[2].data(), {kv, d}),       view(v[3].data(), {d, q}),
                            has_norm ? v[4].data() : nullptr, has_norm ? v[5].data() : nullptr};
  };
  auto grads = [&](std::vector<std::vector<float>>& v) {
    return AttentionGrads{v[0].data(),
                          v[1].data(),
                          v[2].data(),
                          v[3].data(),
                          has_norm ? v[4].data() : nullptr,
                          has_norm ? v[5].data() : nullptr};
  };
  const std::vector<float> r = random_vec(x.size(), seed + 7);
  auto loss = [&] {
    AttentionCache cache;
    std::vector<float> y(x.size());
    block.forward(weights(w), x.data(), batch, seq, y.data(), cache);
    return project(y.data(), r);
  };
  AttentionCache cache;
  std::vector<float> y(x.size());
  block.forward(weights(w), x.data(), batch, seq, y.data(), cache);
  std::vector<std::vector<float>> dw_before;
  for (size_t i = 0; i < w.size(); ++i)
    dw_before.push_back(random_vec(w[i].size(), seed + 10 + static_cast<uint32_t>(i), -0.5f, 0.5f));
  std::vector<std::vector<float>> dw = dw_before;
  std::vector<float> dx(x.size(), 7.0f);  // overwritten
  Workspace workspace;
  block.backward(weights(w), grads(dw), x.data(), r.data(), cache, dx.data(), workspace);
  expect_close(check_all(x.data(), x.size(), dx.data(), kLayerFdEps, loss), "attention dx");
  const char* names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"};
  for (size_t i = 0; i < (has_norm ? w.size() : 4); ++i) {
    const std::vector<float> g = added(dw[i], dw_before[i]);
    expect_close(check_all(w[i].data(), w[i].size(), g.data(), kLayerFdEps, loss),
                 std::string("attention d") + names[i]);
  }
}

TEST(LayerGradients, AttentionNoQkNormMha) {
  check_attention(QkNorm::kNone, 2, 130);
}
TEST(LayerGradients, AttentionNoQkNormGqa) {
  check_attention(QkNorm::kNone, 1, 140);
}
TEST(LayerGradients, AttentionFullQkNormMha) {
  check_attention(QkNorm::kFull, 2, 150);
}
TEST(LayerGradients, AttentionFullQkNormGqa) {
  check_attention(QkNorm::kFull, 1, 160);
}
TEST(LayerGradients, AttentionPerHeadQkNormMha) {
  check_attention(QkNorm::kPerHead, 2, 170);
}
TEST(LayerGradients, AttentionPerHeadQkNormGqa) {
  check_attention(QkNorm::kPerHead, 1, 180);
}

}  // namespace
}  // namespace moecore
