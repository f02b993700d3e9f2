// Causal attention on the CPU: (batch, head) pairs over the OpenMP pool, each a sequence of
// row-block GEMMs (oneDNN, sequential inside the parallel region) and an fp32 softmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

// Queries are processed in row blocks of this many positions. Block r only needs keys [0, r1), so
// the scores/probs GEMMs skip the (fully masked) upper block triangle: about half the FLOPs of a
// full T x T product. 64 keeps each GEMM large enough for the sgemm microkernels.
constexpr int64_t kBlock = 64;

struct AttentionShape {
  int64_t batch, seq, n_heads, n_kv_heads, head_dim;
};

// The shape of q [B, T, heads, hd] and k [B, T, kv_heads, hd], checked.
AttentionShape attention_shape(const char* op, ConstTensorView q, ConstTensorView k) {
  MOE_CHECK(q.rank() == 4 && k.rank() == 4,
            "[{}] q and k must be [batch, seq, heads, head_dim], got ranks {} and {}", op, q.rank(),
            k.rank());
  const AttentionShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  MOE_CHECK(s.batch > 0 && s.seq > 0 && s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0,
            "[{}] batch={} seq={} n_heads={} n_kv_heads={} head_dim={} must all be positive", op,
            s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim);
  MOE_CHECK(s.n_heads % s.n_kv_heads == 0, "[{}] n_kv_heads={} does not divide n_heads={}", op,
            s.n_kv_heads, s.n_heads);
  expect_shape(op, "q", q, {s.batch, s.seq, s.n_heads, s.head_dim});
  expect_shape(op, "k", k, {s.batch, s.seq, s.n_kv_heads, s.head_dim});
  return s;
}

// Softmax of one row's first n scores, in place, with max-subtraction as torch does so exp never
// overflows; statistics stay in float (fp32 softmax as in HF eager attention). Max and sum reduce
// in kSumLanes lanes.
MOECORE_SIMD_CLONES void softmax_prefix(float* row, int64_t n) {
  const float max_val = lane_max(row, n);
  for (int64_t j = 0; j < n; ++j) row[j] = exp_vectorizable(row[j] - max_val);
  // sum >= 1 (the max term contributes exp(0)), so the reciprocal is safe.
  const float inv_sum = 1.0f / lane_sum(n, [row](int64_t j) { return row[j]; });
  for (int64_t j = 0; j < n; ++j) row[j] *= inv_sum;
}

// In-place causal softmax of rows [r0, r1) of a T x T score matrix whose columns [0, r1) hold
// valid scores. Row i keeps columns [start_i, i] (start_i = doc_start[i], or 0 without document
// masking); the other columns are written as 0 so the saved probs are exact zeros outside the mask
// (the PV GEMM and the backward rely on that).
void causal_softmax_rows(float* p, int64_t seq, int64_t r0, int64_t r1, const int32_t* doc_start) {
  for (int64_t i = r0; i < r1; ++i) {
    float* row = p + i * seq;
    const int64_t start = doc_start != nullptr ? doc_start[i] : 0;
    std::fill(row, row + start, 0.0f);
    softmax_prefix(row + start, i + 1 - start);
    std::fill(row + i + 1, row + seq, 0.0f);
  }
}

}  // namespace

void causal_attention_forward(ConstTensorView q_view, ConstTensorView k_view,
                              ConstTensorView v_view, TensorView out_view, TensorView probs_view,
                              ConstTensorView doc_start_view, MatmulPrecision precision) {
  // q: [B, T, H, hd]; k, v: [B, T, KV, hd]; doc_start: [B, T] or empty
  //   -> out: [B, T, H, hd], probs: [B, H, T, T].
  constexpr const char* kOp = "attention";
  const AttentionShape s = attention_shape(kOp, q_view, k_view);
  const int64_t T = s.seq, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  expect_shape(kOp, "v", v_view, {s.batch, T, KV, hd});
  expect_shape(kOp, "out", out_view, {s.batch, T, H, hd});
  expect_shape(kOp, "probs", probs_view, {s.batch, H, T, T});
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  float* out = out_view.data<float>(kOp);
  float* probs = probs_view.data<float>(kOp);
  const int32_t* doc_start = nullptr;
  if (doc_start_view.raw() != nullptr) {
    expect_shape(kOp, "doc_start", doc_start_view, {s.batch, T});
    doc_start = doc_start_view.data<int32_t>(kOp);
  }
  if (doc_start != nullptr) {
    for (int64_t i = 0; i < s.batch * T; ++i)
      MOE_CHECK(doc_start[i] >= 0 && doc_start[i] <= i % T,
                "[attention] doc_start={} at (batch {}, position {}) is not in [0, position]",
                doc_start[i], i / T, i % T);
  }
  const int64_t group = H / KV;
  // Row strides of one head's [T, hd] slice inside the interleaved [B, T, heads, hd] layouts: the
  // GEMMs read the heads in place, no transposed copies.
  const int64_t ldq = H * hd, ldkv = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Each (b, h) is independent and writes disjoint out/probs slices. oneDNN runs sequentially
  // inside an OpenMP parallel region, so the GEMMs below do not oversubscribe the pool.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      const float* qh = q + (b * T * H + h) * hd;
      const float* kh = k + (b * T * KV + kvh) * hd;
      const float* vh = v + (b * T * KV + kvh) * hd;
      float* oh = out + (b * T * H + h) * hd;
      float* p = probs + (b * H + h) * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(r0 + kBlock, T);
        // scores[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T; later keys are masked anyway.
        gemm(precision, false, true, r1 - r0, r1, hd, scale, qh + r0 * ldq, ldq, kh, ldkv, 0.0f,
             p + r0 * T, T);
        causal_softmax_rows(p, T, r0, r1, doc_start != nullptr ? doc_start + b * T : nullptr);
        // out[r0:r1] = probs[r0:r1, 0:r1] v[0:r1]; probs are 0 above the diagonal in this range.
        gemm(precision, false, false, r1 - r0, hd, r1, 1.0f, p + r0 * T, T, vh, ldkv, 0.0f,
             oh + r0 * ldq, ldq);
      }
    }
  }
}

void causal_attention_backward(ConstTensorView dout_view, ConstTensorView q_view,
                               ConstTensorView k_view, ConstTensorView v_view,
                               ConstTensorView probs_view, TensorView dq_view, TensorView dk_view,
                               TensorView dv_view, MatmulPrecision precision) {
  // dout: [B, T, H, hd]; q: [B, T, H, hd]; k, v: [B, T, KV, hd]; probs: [B, H, T, T]
  //   -> dq: [B, T, H, hd], dk, dv: [B, T, KV, hd] (overwritten).
  // With P = probs, O = P V, S = scale * Q K^T:
  //   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale dS K,
  //   dK = scale dS^T Q; dK and dV sum over the query heads sharing the kv head.
  constexpr const char* kOp = "attention_backward";
  const AttentionShape s = attention_shape(kOp, q_view, k_view);
  const int64_t T = s.seq, H = s.n_heads, KV = s.n_kv_heads, hd = s.head_dim;
  expect_shape(kOp, "dout", dout_view, {s.batch, T, H, hd});
  expect_shape(kOp, "v", v_view, {s.batch, T, KV, hd});
  expect_shape(kOp, "probs", probs_view, {s.batch, H, T, T});
  expect_shape(kOp, "dq", dq_view, {s.batch, T, H, hd});
  expect_shape(kOp, "dk", dk_view, {s.batch, T, KV, hd});
  expect_shape(kOp, "dv", dv_view, {s.batch, T, KV, hd});
  const float* dout = dout_view.data<float>(kOp);
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  const float* probs = probs_view.data<float>(kOp);
  float* dq = dq_view.data<float>(kOp);
  float* dk = dk_view.data<float>(kOp);
  float* dv = dv_view.data<float>(kOp);
  const int64_t group = H / KV;
  const int64_t ldq = H * hd, ldkv = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Parallel over (b, kv head): the query heads of one group all add into the same dk/dv slice,
  // so they run sequentially inside one iteration; no atomics, no per-head dk/dv copies.
  // dS scratch, one per thread, reused across iterations and kept for the next call, grown to the
  // longest sequence seen (a training step asks the heap for nothing after the first: issue 14).
  // T x T; only the lower part is read, and every entry read is written first in this call.
  thread_local std::vector<float> ds_scratch;
#pragma omp parallel
  {
    if (ds_scratch.size() < static_cast<size_t>(T * T))
      ds_scratch.resize(static_cast<size_t>(T * T));
    float* const ds = ds_scratch.data();
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        const float* kh = k + (b * T * KV + kvh) * hd;
        const float* vh = v + (b * T * KV + kvh) * hd;
        float* dkh = dk + (b * T * KV + kvh) * hd;
        float* dvh = dv + (b * T * KV + kvh) * hd;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* qh = q + (b * T * H + h) * hd;
          const float* doh = dout + (b * T * H + h) * hd;
          const float* p = probs + (b * H + h) * T * T;
          float* dqh = dq + (b * T * H + h) * hd;
          // The first head of the group overwrites dk/dv (activation-gradient rule), the rest add.
          const float beta_kv = g == 0 ? 0.0f : 1.0f;

          // Row blocks: dP, dS and dQ for queries [r0, r1) only involve keys [0, r1).
          for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
            const int64_t r1 = std::min(r0 + kBlock, T);
            // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T, written straight into the dS scratch.
            gemm(precision, false, true, r1 - r0, r1, hd, 1.0f, doh + r0 * ldq, ldq, vh, ldkv, 0.0f,
                 ds + r0 * T, T);
            for (int64_t i = r0; i < r1; ++i) {
              const float* p_row = p + i * T;
              float* ds_row = ds + i * T;
              const int64_t n = i + 1;
              // rowsum(P * dP) equals dot(dO_i, O_i); computed from P and dP so the output need
              // not be saved. Accumulated in double: it is a length-T reduction and free here.
              double dot = 0.0;
              for (int64_t j = 0; j < n; ++j)
                dot += static_cast<double>(p_row[j]) * static_cast<double>(ds_row[j]);
              const float dotf = static_cast<float>(dot);
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) ds_row[j] = p_row[j] * (ds_row[j] - dotf);
              // Masked entries have zero gradient; zero them so the dK GEMM below can read whole
              // diagonal blocks.
              std::fill(ds_row + n, ds_row + r1, 0.0f);
            }
            // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1].
            gemm(precision, false, false, r1 - r0, hd, r1, scale, ds + r0 * T, T, kh, ldkv, 0.0f,
                 dqh + r0 * ldq, ldq);
          }

          // Column blocks (same partition as the rows, so every dS entry read was written above):
          // keys [c0, c1) only receive gradient from queries [c0, T).
          for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
            const int64_t c1 = std::min(c0 + kBlock, T);
            // dV[c0:c1] (+)= P[c0:T, c0:c1]^T dO[c0:T].
            gemm(precision, true, false, c1 - c0, hd, T - c0, 1.0f, p + c0 * T + c0, T,
                 doh + c0 * ldq, ldq, beta_kv, dvh + c0 * ldkv, ldkv);
            // dK[c0:c1] (+)= scale * dS[c0:T, c0:c1]^T Q[c0:T].
            gemm(precision, true, false, c1 - c0, hd, T - c0, scale, ds + c0 * T + c0, T,
                 qh + c0 * ldq, ldq, beta_kv, dkh + c0 * ldkv, ldkv);
          }
        }
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
