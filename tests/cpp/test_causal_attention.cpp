// Causal GQA attention: forward against a double triple-loop reference, backward against finite
// differences of that reference, GQA grouping, causality and the overwrite rule for gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/check.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/attention.h"
#include "model/document_mask.h"

namespace moecore {
namespace {

using gradcheck::random_vec;  // uniform in [-1, 1)
using gradcheck::to_double;

// The kernels on contiguous buffers of shape s (the views' shapes are what the kernels check).
void causal_attention_forward(const AttentionShape& s, const float* q, const float* k,
                              const float* v, float* out, float* probs,
                              const int32_t* doc_start = nullptr) {
  const int64_t B = s.batch, T = s.seq, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  kernels::causal_attention_forward(
      view(q, {B, T, H, hd}), view(k, {B, T, KV, hd}), view(v, {B, T, KV, hd}),
      view(out, {B, T, H, hd}), view(probs, {B, H, T, T}),
      doc_start != nullptr ? view(doc_start, {B, T}) : ConstTensorView{},
      kernels::MatmulPrecision::kFp32);
}

void causal_attention_backward(const AttentionShape& s, const float* dout, const float* q,
                               const float* k, const float* v, const float* probs, float* dq,
                               float* dk, float* dv) {
  const int64_t B = s.batch, T = s.seq, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  kernels::causal_attention_backward(
      view(dout, {B, T, H, hd}), view(q, {B, T, H, hd}), view(k, {B, T, KV, hd}),
      view(v, {B, T, KV, hd}), view(probs, {B, H, T, T}), view(dq, {B, T, H, hd}),
      view(dk, {B, T, KV, hd}), view(dv, {B, T, KV, hd}), kernels::MatmulPrecision::kFp32);
}

size_t q_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.seq * s.n_heads * s.head_dim);
}
size_t kv_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.seq * s.n_kv_heads * s.head_dim);
}
size_t probs_size(const AttentionShape& s) {
  return static_cast<size_t>(s.batch * s.n_heads * s.seq * s.seq);
}

// Reference in double: for each query row, softmax over keys 0..i of q.k / sqrt(hd), then a
// weighted sum of v. Written from the definition, with HF's h / (H / KV) head grouping.
// With doc_start ([B, T]), row i's keys are [doc_start[i], i] instead of [0, i].
std::vector<double> reference_attention(const AttentionShape& s, const std::vector<double>& q,
                                        const std::vector<double>& k, const std::vector<double>& v,
                                        std::vector<double>* probs = nullptr,
                                        const std::vector<int32_t>* doc_start = nullptr) {
  const int64_t T = s.seq, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  std::vector<double> out(q_size(s), 0.0);
  if (probs) probs->assign(probs_size(s), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> w(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = doc_start ? (*doc_start)[static_cast<size_t>(b * T + i)] : 0;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            dot += q[((b * T + i) * H + h) * hd + d] * k[((b * T + j) * KV + kvh) * hd + d];
          w[j] = dot * scale;
          mx = std::max(mx, w[j]);
        }
        double sum = 0.0;
        for (int64_t j = j0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int64_t j = j0; j <= i; ++j) {
          const double p = w[j] / sum;
          if (probs) (*probs)[((b * H + h) * T + i) * T + j] = p;
          for (int64_t d = 0; d < hd; ++d)
            out[((b * T + i) * H + h) * hd + d] += p * v[((b * T + j) * KV + kvh) * hd + d];
        }
      }
    }
  return out;
}

struct Grads {
  std::vector<float> out, probs, dq, dk, dv;
};

// Runs forward and backward of the implementation with the loss L = sum(out * r), i.e. dout = r.
Grads run_impl(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v, const std::vector<float>& r,
               const std::vector<int32_t>* doc_start = nullptr) {
  Grads g;
  // Pre-fill every output with NaN: the functions must overwrite, never read, their outputs.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  g.out.assign(q_size(s), nan);
  g.probs.assign(probs_size(s), nan);
  g.dq.assign(q_size(s), nan);
  g.dk.assign(kv_size(s), nan);
  g.dv.assign(kv_size(s), nan);
  causal_attention_forward(s, q.data(), k.data(), v.data(), g.out.data(), g.probs.data(),
                           doc_start ? doc_start->data() : nullptr);
  causal_attention_backward(s, r.data(), q.data(), k.data(), v.data(), g.probs.data(), g.dq.data(),
                            g.dk.data(), g.dv.data());
  return g;
}

double max_abs(const std::vector<double>& a) {
  double m = 0.0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

void expect_forward_matches(const AttentionShape& s, uint32_t seed) {
  const auto q = random_vec(q_size(s), seed), k = random_vec(kv_size(s), seed + 1),
             v = random_vec(kv_size(s), seed + 2), r = random_vec(q_size(s), seed + 3);
  const Grads g = run_impl(s, q, k, v, r);
  std::vector<double> ref_probs;
  const auto ref = reference_attention(s, to_double(q), to_double(k), to_double(v), &ref_probs);
  double out_err = 0.0, p_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    out_err = std::max(out_err, std::abs(static_cast<double>(g.out[i]) - ref[i]));
  for (size_t i = 0; i < ref_probs.size(); ++i)
    p_err = std::max(p_err, std::abs(static_cast<double>(g.probs[i]) - ref_probs[i]));
  // Inputs in [-1, 1], so outputs and probs are O(1): absolute float tolerance, a few hundred ulp
  // of 1 to cover the length-T fp32 sums and the fp32 exp (derived: T <= 130 terms of size <= 1,
  // sqrt(T) u ~ 7e-7 typical). Measured 1.1e-7 (out, AVX2 kernels) and 5.5e-8 (probs).
  EXPECT_LE(out_err, 1e-5);
  EXPECT_LE(p_err, 1e-5);
  // The masked upper triangle is exactly 0 (the backward relies on it).
  for (int64_t bh = 0; bh < s.batch * s.n_heads; ++bh)
    for (int64_t i = 0; i < s.seq; ++i)
      for (int64_t j = i + 1; j < s.seq; ++j)
        ASSERT_EQ(g.probs[static_cast<size_t>((bh * s.seq + i) * s.seq + j)], 0.0f);
}

TEST(CausalAttention, ForwardMatchesReference) {
  expect_forward_matches({2, 7, 4, 2, 8}, 10);
  expect_forward_matches({1, 5, 3, 3, 5}, 20);   // MHA, odd head_dim
  expect_forward_matches({1, 70, 2, 1, 4}, 30);  // T spans two 64-row blocks
  expect_forward_matches({2, 130, 4, 2, 16}, 40);
}

// Central differences of the double reference for every element of q, k and v (with doc_start,
// of the document-masked reference); the analytic float gradients must satisfy
// max |analytic - numeric| / max |numeric| <= 1e-4 per tensor (the float path carries ~1e-6
// relative rounding; the O(eps^2) truncation error is ~1e-10). Measured 1.9e-7 on every ISA
// setting.
void expect_gradients_match(const AttentionShape& s, uint32_t seed,
                            const std::vector<int32_t>* doc_start = nullptr) {
  const auto q = random_vec(q_size(s), seed), k = random_vec(kv_size(s), seed + 1),
             v = random_vec(kv_size(s), seed + 2), r = random_vec(q_size(s), seed + 3);
  const Grads g = run_impl(s, q, k, v, r, doc_start);
  std::vector<double> qd = to_double(q), kd = to_double(k), vd = to_double(v);
  auto loss = [&]() {
    const auto out = reference_attention(s, qd, kd, vd, nullptr, doc_start);
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * static_cast<double>(r[i]);
    return l;
  };
  const double eps = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<float>& analytic, const char* name) {
    std::vector<double> numeric(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + eps;
      const double lp = loss();
      x[i] = saved - eps;
      const double lm = loss();
      x[i] = saved;
      numeric[i] = (lp - lm) / (2 * eps);
    }
    double max_diff = 0.0;
    for (size_t i = 0; i < x.size(); ++i)
      max_diff = std::max(max_diff, std::abs(static_cast<double>(analytic[i]) - numeric[i]));
    EXPECT_LE(max_diff / max_abs(numeric), 1e-4) << name;
  };
  check(qd, g.dq, "dq");
  check(kd, g.dk, "dk");
  check(vd, g.dv, "dv");
}

TEST(CausalAttention, BackwardMatchesFiniteDifferences) {
  expect_gradients_match({2, 6, 4, 2, 4}, 50);  // GQA, group of 2
  expect_gradients_match({1, 5, 4, 1, 3}, 60);  // MQA
  expect_gradients_match({1, 4, 2, 2, 4}, 70);  // MHA
}

TEST(CausalAttention, BackwardDirectionalDerivativeAcrossBlocks) {
  // T = 150 crosses the 64-position blocks; a full finite-difference sweep would be slow, so
  // compare directional derivatives: for a random direction (u_q, u_k, u_v),
  // (L(x + eps u) - L(x - eps u)) / 2eps in double vs <dq, u_q> + <dk, u_k> + <dv, u_v>.
  // Tolerance: |analytic - numeric| <= 1e-4 * sum_i |grad_i * u_i| (the scale of the dot product;
  // float gradients carry ~1e-6 of it). Measured 1.6e-6 absolute, 8e-5 of the bound.
  const AttentionShape s{1, 150, 4, 2, 8};
  const auto q = random_vec(q_size(s), 80), k = random_vec(kv_size(s), 81),
             v = random_vec(kv_size(s), 82), r = random_vec(q_size(s), 83);
  const Grads g = run_impl(s, q, k, v, r);
  for (uint32_t dir = 0; dir < 3; ++dir) {
    const auto uq = random_vec(q.size(), 90 + 3 * dir), uk = random_vec(k.size(), 91 + 3 * dir),
               uv = random_vec(v.size(), 92 + 3 * dir);
    auto loss = [&](double t) {
      std::vector<double> qd(q.size()), kd(k.size()), vd(v.size());
      for (size_t i = 0; i < q.size(); ++i)
        qd[i] = static_cast<double>(q[i]) + t * static_cast<double>(uq[i]);
      for (size_t i = 0; i < k.size(); ++i)
        kd[i] = static_cast<double>(k[i]) + t * static_cast<double>(uk[i]);
      for (size_t i = 0; i < v.size(); ++i)
        vd[i] = static_cast<double>(v[i]) + t * static_cast<double>(uv[i]);
      const auto out = reference_attention(s, qd, kd, vd);
      double l = 0.0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * static_cast<double>(r[i]);
      return l;
    };
    const double eps = 1e-5;
    const double numeric = (loss(eps) - loss(-eps)) / (2 * eps);
    double analytic = 0.0, scale = 0.0;
    auto acc = [&](const std::vector<float>& grad, const std::vector<float>& u) {
      for (size_t i = 0; i < u.size(); ++i) {
        const double term = static_cast<double>(grad[i]) * static_cast<double>(u[i]);
        analytic += term;
        scale += std::abs(term);
      }
    };
    acc(g.dq, uq);
    acc(g.dk, uk);
    acc(g.dv, uv);
    EXPECT_LE(std::abs(analytic - numeric), 1e-4 * scale) << "direction " << dir;
  }
}

// ---- Intra-document masking (data.document_masking) ----------------------------------------

// doc_start of rows whose documents end at the given EOS positions (model/document_mask.h).
std::vector<int32_t> starts_from_eos(int64_t batch, int64_t seq,
                                     const std::vector<std::vector<int64_t>>& eos_positions) {
  std::vector<int32_t> starts(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t current = 0;
    for (int64_t t = 0; t < seq; ++t) {
      starts[static_cast<size_t>(b * seq + t)] = current;
      const auto& ends = eos_positions[static_cast<size_t>(b)];
      if (std::find(ends.begin(), ends.end(), t) != ends.end())
        current = static_cast<int32_t>(t + 1);
    }
  }
  return starts;
}

TEST(CausalAttention, DocumentMaskingMatchesReferenceAndZeroesOtherDocuments) {
  // Boundaries inside and across the 64-row blocks, a row with one document, a one-token doc.
  const AttentionShape s{3, 150, 4, 2, 8};
  const std::vector<int32_t> starts = starts_from_eos(3, 150, {{9, 63, 64, 100}, {}, {0, 70, 148}});
  const auto q = random_vec(q_size(s), 300), k = random_vec(kv_size(s), 301),
             v = random_vec(kv_size(s), 302), r = random_vec(q_size(s), 303);
  const Grads g = run_impl(s, q, k, v, r, &starts);
  std::vector<double> ref_probs;
  const auto ref =
      reference_attention(s, to_double(q), to_double(k), to_double(v), &ref_probs, &starts);
  double out_err = 0.0, p_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    out_err = std::max(out_err, std::abs(static_cast<double>(g.out[i]) - ref[i]));
  for (size_t i = 0; i < ref_probs.size(); ++i)
    p_err = std::max(p_err, std::abs(static_cast<double>(g.probs[i]) - ref_probs[i]));
  EXPECT_LE(out_err, 1e-5);
  EXPECT_LE(p_err, 1e-5);
  // Keys of other documents get exactly 0 probability.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.n_heads; ++h)
      for (int64_t i = 0; i < s.seq; ++i)
        for (int64_t j = 0; j < starts[static_cast<size_t>(b * s.seq + i)]; ++j)
          ASSERT_EQ(g.probs[static_cast<size_t>(((b * s.n_heads + h) * s.seq + i) * s.seq + j)],
                    0.0f);
  // Without the mask the outputs differ (the test above would pass vacuously otherwise).
  const Grads plain = run_impl(s, q, k, v, r);
  double diff = 0.0;
  for (size_t i = 0; i < g.out.size(); ++i)
    diff = std::max(diff, std::abs(static_cast<double>(g.out[i] - plain.out[i])));
  EXPECT_GT(diff, 1e-2);
  // Row 1 is one document: identical to plain causal attention there.
  const size_t row = q_size(s) / 3;
  for (size_t i = row; i < 2 * row; ++i) ASSERT_EQ(g.out[i], plain.out[i]);
}

TEST(CausalAttention, DocumentMaskingEqualsSeparateSequences) {
  // A row {doc A (5 tokens), doc B (7 tokens)} gives, token for token, the outputs and gradients
  // of A and B run as two separate sequences (what varlen flash attention computes).
  const AttentionShape packed{1, 12, 2, 1, 4};
  const std::vector<int32_t> starts = starts_from_eos(1, 12, {{4}});
  const auto q = random_vec(q_size(packed), 400), k = random_vec(kv_size(packed), 401),
             v = random_vec(kv_size(packed), 402), r = random_vec(q_size(packed), 403);
  const Grads g = run_impl(packed, q, k, v, r, &starts);
  const int64_t qrow = packed.n_heads * packed.head_dim,
                kvrow = packed.n_kv_heads * packed.head_dim;
  auto slice = [](const std::vector<float>& x, int64_t begin, int64_t end, int64_t width) {
    return std::vector<float>(x.begin() + begin * width, x.begin() + end * width);
  };
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 5}, {5, 12}}) {
    const AttentionShape alone{1, end - begin, 2, 1, 4};
    const Grads a = run_impl(alone, slice(q, begin, end, qrow), slice(k, begin, end, kvrow),
                             slice(v, begin, end, kvrow), slice(r, begin, end, qrow));
    auto expect_close = [&](const std::vector<float>& whole, const std::vector<float>& part,
                            int64_t width, const char* name) {
      for (size_t i = 0; i < part.size(); ++i)
        EXPECT_NEAR(whole[static_cast<size_t>(begin * width) + i], part[i], 1e-6)
            << name << " of document [" << begin << ", " << end << ") at " << i;
    };
    expect_close(g.out, a.out, qrow, "out");
    expect_close(g.dq, a.dq, qrow, "dq");
    expect_close(g.dk, a.dk, kvrow, "dk");
    expect_close(g.dv, a.dv, kvrow, "dv");
  }
}

TEST(CausalAttention, DocumentMaskingBackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> starts = starts_from_eos(2, 7, {{2, 3}, {5}});
  expect_gradients_match({2, 7, 4, 2, 4}, 500, &starts);
}

TEST(CausalAttention, DocumentStartsFollowOlmoCoreDocumentLengths) {
  // olmo_core.data.utils.get_document_lengths([7, 1, 7, 7, 1, 1, 7], eos=1) = [2, 3, 1, 1].
  const std::vector<int32_t> row = {7, 1, 7, 7, 1, 1, 7};
  EXPECT_EQ(document_lengths(row.data(), 7, 1), (std::vector<int64_t>{2, 3, 1, 1}));
  std::vector<int32_t> starts(7);
  document_starts(row.data(), 1, 7, 1, -1, starts.data());
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 6}));
  // Ending in EOS adds no empty document; no EOS is one document.
  const std::vector<int32_t> ends = {3, 1}, none = {3, 4};
  EXPECT_EQ(document_lengths(ends.data(), 2, 1), (std::vector<int64_t>{2}));
  EXPECT_EQ(document_lengths(none.data(), 2, 1), (std::vector<int64_t>{2}));
  // With a BOS id, only an EOS that a BOS follows ends a document (here one id for both, as
  // GPT-2's tokenizer has): get_document_lengths([0, 5, 6, 0, 0, 7, 0, 0, 8], eos=0, bos=0)
  // = [4, 3, 2]; without the BOS rule every 0 ends one: [1, 3, 1, 2, 1, 1].
  const std::vector<int32_t> bos_row = {0, 5, 6, 0, 0, 7, 0, 0, 8};
  EXPECT_EQ(document_lengths(bos_row.data(), 9, 0, 0), (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(document_lengths(bos_row.data(), 9, 0), (std::vector<int64_t>{1, 3, 1, 2, 1, 1}));
  std::vector<int32_t> bos_starts(9);
  document_starts(bos_row.data(), 1, 9, 0, 0, bos_starts.data());
  EXPECT_EQ(bos_starts, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 7, 7}));
  // A doc_start outside [0, position] is refused.
  const AttentionShape s{1, 2, 1, 1, 2};
  std::vector<float> x(4, 0.5f), out(4), probs(4);
  const std::vector<int32_t> bad = {0, 2};
  EXPECT_THROW(causal_attention_forward(s, x.data(), x.data(), x.data(), out.data(), probs.data(),
                                        bad.data()),
               Error);
}

TEST(CausalAttention, GqaSingleTokenTinyHead) {
  // seq 1, head_dim 2: the only key gets probability 1, so out = v of the group's kv head, dq = 0
  // (softmax of one score is constant) and dv = sum of dout over the group's query heads.
  for (int64_t kv_heads : {int64_t{2}, int64_t{1}}) {
    const AttentionShape s{2, 1, 4, kv_heads, 2};
    const auto q = random_vec(q_size(s), 100), k = random_vec(kv_size(s), 101),
               v = random_vec(kv_size(s), 102), r = random_vec(q_size(s), 103);
    const Grads g = run_impl(s, q, k, v, r);
    const int64_t group = s.n_heads / kv_heads;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.n_heads; ++h)
        for (int64_t d = 0; d < 2; ++d) {
          const size_t qi = static_cast<size_t>((b * s.n_heads + h) * 2 + d);
          const size_t ki = static_cast<size_t>((b * kv_heads + h / group) * 2 + d);
          EXPECT_FLOAT_EQ(g.out[qi], v[ki]);
          EXPECT_EQ(g.dq[qi], 0.0f);
          EXPECT_EQ(g.probs[static_cast<size_t>(b * s.n_heads + h)], 1.0f);
        }
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh)
        for (int64_t d = 0; d < 2; ++d) {
          float sum = 0.0f;
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
            sum += r[static_cast<size_t>((b * s.n_heads + h) * 2 + d)];
          const size_t ki = static_cast<size_t>((b * kv_heads + kvh) * 2 + d);
          EXPECT_NEAR(g.dv[ki], sum, 1e-6f);
          EXPECT_EQ(g.dk[ki], 0.0f);
        }
  }
}

TEST(CausalAttention, GqaEqualsRepeatedKvHeads) {
  // HF's repeat_kv: GQA with KV heads equals MHA with each kv head copied to its group's query
  // heads; the GQA dk/dv are the sums of the copies' dk/dv.
  for (int64_t kv_heads : {int64_t{2}, int64_t{1}}) {
    const AttentionShape gqa{2, 9, 4, kv_heads, 4};
    const AttentionShape mha{2, 9, 4, 4, 4};
    const int64_t group = 4 / kv_heads, T = 9, hd = 4;
    const auto q = random_vec(q_size(gqa), 110), k = random_vec(kv_size(gqa), 111),
               v = random_vec(kv_size(gqa), 112), r = random_vec(q_size(gqa), 113);
    std::vector<float> k_rep(q_size(mha)), v_rep(q_size(mha));
    for (int64_t bt = 0; bt < 2 * T; ++bt)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < hd; ++d) {
          k_rep[(bt * 4 + h) * hd + d] = k[(bt * kv_heads + h / group) * hd + d];
          v_rep[(bt * 4 + h) * hd + d] = v[(bt * kv_heads + h / group) * hd + d];
        }
    const Grads a = run_impl(gqa, q, k, v, r);
    const Grads m = run_impl(mha, q, k_rep, v_rep, r);
    // Identity: the same products in the same order (measured 0 on every ISA setting); the bounds
    // leave a few ulps of values <= ~2 (and of the group sums, 1e-5) for a change of loop order.
    for (size_t i = 0; i < a.out.size(); ++i) {
      ASSERT_NEAR(a.out[i], m.out[i], 1e-6f);
      ASSERT_NEAR(a.dq[i], m.dq[i], 1e-6f);
    }
    for (int64_t bt = 0; bt < 2 * T; ++bt)
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh)
        for (int64_t d = 0; d < hd; ++d) {
          float sk = 0.0f, sv = 0.0f;
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            sk += m.dk[(bt * 4 + h) * hd + d];
            sv += m.dv[(bt * 4 + h) * hd + d];
          }
          ASSERT_NEAR(a.dk[(bt * kv_heads + kvh) * hd + d], sk, 1e-5f);
          ASSERT_NEAR(a.dv[(bt * kv_heads + kvh) * hd + d], sv, 1e-5f);
        }
  }
}

TEST(CausalAttention, FutureKeysDoNotAffectEarlierOutputs) {
  const AttentionShape s{2, 80, 4, 2, 8};
  const auto q = random_vec(q_size(s), 120), k = random_vec(kv_size(s), 121),
             v = random_vec(kv_size(s), 122), r = random_vec(q_size(s), 123);
  const Grads base = run_impl(s, q, k, v, r);
  const int64_t row = s.n_heads * s.head_dim, kv_row = s.n_kv_heads * s.head_dim;
  for (int64_t t : {int64_t{1}, int64_t{40}, int64_t{70}}) {
    std::vector<float> k2 = k, v2 = v;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < kv_row; ++i) {
        k2[(b * s.seq + t) * kv_row + i] += 3.0f;
        v2[(b * s.seq + t) * kv_row + i] -= 5.0f;
      }
    const Grads changed = run_impl(s, q, k2, v2, r);
    double diff_before = 0.0, diff_at = 0.0;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.seq; ++i)
        for (int64_t j = 0; j < row; ++j) {
          const size_t idx = static_cast<size_t>((b * s.seq + i) * row + j);
          const double d =
              std::abs(static_cast<double>(base.out[idx]) - static_cast<double>(changed.out[idx]));
          if (i < t) diff_before = std::max(diff_before, d);
          if (i == t) diff_at = std::max(diff_at, d);
        }
    // Masked keys get probability exactly 0, so earlier outputs are bit-for-bit unchanged.
    EXPECT_EQ(diff_before, 0.0) << "t=" << t;
    EXPECT_GT(diff_at, 1e-3) << "t=" << t;  // the change is visible from position t on
  }
}

TEST(CausalAttention, GradientOfEarlierOutputsIgnoresLaterKeys) {
  // With dout nonzero only at positions < t, keys/values at positions >= t get exactly zero
  // gradient (they are masked out of every query that carries gradient).
  const AttentionShape s{1, 100, 2, 1, 8};
  const int64_t t = 66, row = s.n_heads * s.head_dim, kv_row = s.n_kv_heads * s.head_dim;
  const auto q = random_vec(q_size(s), 130), k = random_vec(kv_size(s), 131),
             v = random_vec(kv_size(s), 132);
  auto r = random_vec(q_size(s), 133);
  std::fill(r.begin() + t * row, r.end(), 0.0f);
  const Grads g = run_impl(s, q, k, v, r);
  for (int64_t i = t * kv_row; i < s.seq * kv_row; ++i) {
    ASSERT_EQ(g.dk[static_cast<size_t>(i)], 0.0f) << i;
    ASSERT_EQ(g.dv[static_cast<size_t>(i)], 0.0f) << i;
  }
  EXPECT_GT(std::abs(g.dv[static_cast<size_t>((t - 1) * kv_row)]), 0.0f);
}

TEST(CausalAttention, RejectsBadShapes) {
  std::vector<float> buf(1024);
  float* p = buf.data();
  EXPECT_THROW(causal_attention_forward({1, 4, 3, 2, 4}, p, p, p, p, p), Error);
  EXPECT_THROW(causal_attention_forward({1, 0, 2, 2, 4}, p, p, p, p, p), Error);
  EXPECT_THROW(causal_attention_forward({1, 4, 2, 0, 4}, p, p, p, p, p), Error);
  EXPECT_THROW(causal_attention_backward({1, 4, 3, 2, 4}, p, p, p, p, p, p, p, p), Error);
  EXPECT_THROW(causal_attention_backward({1, 4, 2, 2, -1}, p, p, p, p, p, p, p, p), Error);
}

}  // namespace
}  // namespace moecore
