// Flash attention on the CPU: causal_attention.cpp's row-block GEMMs (oneDNN, sequential inside
// the OpenMP parallel region) without the T x T probabilities. Each thread holds the scores (and in
// the backward dS) of one block of 64 queries against the keys it meets, at most 64 x T floats
// each, and the forward saves the logsumexp of each query's scores from
// which the backward recomputes the probabilities. The GEMMs, their operands and the fp32 softmax
// are those of causal_attention.cpp, so in bf16 precision the same values are rounded.
//
// The backward runs in one pass parallel over (batch, kv head), as causal_attention.cpp's, each
// iteration the only writer of its dq, dk and dv in a fixed order, so its bits do not depend on
// the thread count: each query block recomputes P = exp(S - lse) and dS once, for its dq rows and
// its share of dk and dv (five GEMMs per block, one more than the probabilities-saving backward).
//
// Every GEMM here runs with alpha = 1 and the softmax scale 1/sqrt(hd) is applied in fp32 around
// it (to the scores, to dq, to the finished dk): oneDNN's bf16 matmul with an output scale runs
// 3-5x slower on these shapes (measured: 64x128x64 in 49 us against 16 us without one).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/flash_attention_checks.h"
#include "kernels/gemm.h"

namespace moecore::kernels::cpu {

namespace {

// Queries (forward, dq pass) or keys (dk/dv pass) per block, as causal_attention.cpp's.
constexpr int64_t kRowBlock = 64;

int64_t doc_start_at(const int32_t* doc_start, int64_t i) {
  return doc_start != nullptr ? doc_start[i] : 0;
}

// The first key any query of rows [r0, r1) attends: keys before it need no scores.
int64_t first_key(const int32_t* doc_start, int64_t r0, int64_t r1) {
  int64_t first = r0;
  for (int64_t i = r0; i < r1; ++i) first = std::min(first, doc_start_at(doc_start, i));
  return first;
}

// The softmax of row scores [start, i] (columns relative to c_lo, row stride n of the block), in
// place as causal_attention.cpp's softmax_prefix computes it, other columns zeroed; returns the
// row's logsumexp max + log(sum). The row holds q.k unscaled: the scores are scale q.k.
MOECORE_SIMD_CLONES float softmax_row(float* row, int64_t n, int64_t start, int64_t end,
                                      float scale) {
  float* x = row + start;
  const int64_t len = end - start;
  for (int64_t j = 0; j < len; ++j) x[j] *= scale;
  const float max_val = lane_max(x, len);
  for (int64_t j = 0; j < len; ++j) x[j] = exp_vectorizable(x[j] - max_val);
  // sum >= 1 (the max term contributes exp(0)), so the reciprocal and the log are safe.
  const float sum = lane_sum(len, [x](int64_t j) { return x[j]; });
  const float inv_sum = 1.0f / sum;
  for (int64_t j = 0; j < len; ++j) x[j] *= inv_sum;
  std::fill(row, x, 0.0f);
  std::fill(row + end, row + n, 0.0f);
  return max_val + std::log(sum);
}

// P = exp(S - lse), S = scale q.k (the row holds q.k), over columns [start, end) of one row of n,
// 0 elsewhere, in place.
MOECORE_SIMD_CLONES void probabilities_row(float* row, int64_t n, int64_t start, int64_t end,
                                           float scale, float lse) {
  std::fill(row, row + start, 0.0f);
  for (int64_t j = start; j < end; ++j) row[j] = exp_vectorizable(row[j] * scale - lse);
  std::fill(row + end, row + n, 0.0f);
}

// dS = P (dP - D) in place of dP over one row of n (P is 0 where masked, and so is dS).
MOECORE_SIMD_CLONES void ds_row(const float* p, float* dp, int64_t n, float row_dot) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - row_dot);
}

// x[0:cols] *= scale over `rows` rows of stride ld.
void scale_rows(float* x, int64_t rows, int64_t cols, int64_t ld, float scale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) x[r * ld + j] *= scale;
}

// D_i = dout_i . out_i, in double (hd terms, fixed order).
float row_dot(const float* dout, const float* out, int64_t hd) {
  double dot = 0.0;
  for (int64_t d = 0; d < hd; ++d)
    dot += static_cast<double>(dout[d]) * static_cast<double>(out[d]);
  return static_cast<float>(dot);
}

// Per-thread scratch kept for the next call and grown to the largest block seen, so that a
// training step asks the heap for nothing after the first (issue 14). Every entry read is
// written first in the same call.
float* thread_scratch(std::vector<float>& scratch, int64_t floats) {
  if (scratch.size() < static_cast<size_t>(floats)) scratch.resize(static_cast<size_t>(floats));
  return scratch.data();
}

}  // namespace

void flash_attention_forward(ConstTensorView q_view, ConstTensorView k_view, ConstTensorView v_view,
                             TensorView out_view, TensorView lse_view,
                             ConstTensorView doc_start_view, MatmulPrecision precision) {
  constexpr const char* kOp = "flash_attention";
  const FlashAttentionDims s =
      flash_attention_dims(kOp, q_view, k_view, v_view, doc_start_view, Device::kCpu);
  expect_flash_forward_outputs(kOp, s, out_view, lse_view, Device::kCpu);
  const int64_t B = s.batch, T = s.seq, H = s.heads, KV = s.kv_heads, hd = s.head_dim;
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  float* out = out_view.data<float>(kOp);
  float* lse = lse_view.data<float>(kOp);
  const int32_t* doc_start =
      doc_start_view.raw() != nullptr ? doc_start_view.data<int32_t>(kOp) : nullptr;
  check_doc_start_values(kOp, doc_start, s);
  const int64_t group = H / KV;
  const int64_t ldq = H * hd, ldkv = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t blocks = (T + kRowBlock - 1) / kRowBlock;

  // Scores of one query block against keys [c_lo, r1): kRowBlock x T floats per thread.
  thread_local std::vector<float> score_scratch;
  // Every (b, h, query block) writes disjoint out rows and lse entries. Later blocks have more
  // keys: dynamic scheduling balances them (the results do not depend on it).
#pragma omp parallel
  {
    float* const p = thread_scratch(score_scratch, kRowBlock * T);
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t kvh = h / group;
          const int64_t r0 = blk * kRowBlock, r1 = std::min(r0 + kRowBlock, T);
          const int32_t* docs = doc_start != nullptr ? doc_start + b * T : nullptr;
          const int64_t c_lo = first_key(docs, r0, r1), n = r1 - c_lo;
          const float* qh = q + (b * T * H + h) * hd;
          const float* kh = k + (b * T * KV + kvh) * hd;
          const float* vh = v + (b * T * KV + kvh) * hd;
          float* oh = out + (b * T * H + h) * hd;
          // q[r0:r1] k[c_lo:r1]^T (row stride n); the softmax scales it.
          gemm(precision, false, true, r1 - r0, n, hd, 1.0f, qh + r0 * ldq, ldq, kh + c_lo * ldkv,
               ldkv, 0.0f, p, n);
          for (int64_t i = r0; i < r1; ++i)
            lse[(b * H + h) * T + i] =
                softmax_row(p + (i - r0) * n, n, doc_start_at(docs, i) - c_lo, i + 1 - c_lo, scale);
          // out[r0:r1] = P[r0:r1, c_lo:r1] v[c_lo:r1].
          gemm(precision, false, false, r1 - r0, hd, n, 1.0f, p, n, vh + c_lo * ldkv, ldkv, 0.0f,
               oh + r0 * ldq, ldq);
        }
      }
    }
  }
}

void flash_attention_backward(ConstTensorView dout_view, ConstTensorView q_view,
                              ConstTensorView k_view, ConstTensorView v_view,
                              ConstTensorView out_view, ConstTensorView lse_view,
                              ConstTensorView doc_start_view, TensorView dq_view,
                              TensorView dk_view, TensorView dv_view, MatmulPrecision precision) {
  // With S = scale Q K^T, P = exp(S - lse) (masked: 0), D_i = dO_i . O_i:
  //   dP = dO V^T, dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO;
  // dK and dV sum over the query heads sharing the kv head.
  constexpr const char* kOp = "flash_attention_backward";
  const FlashAttentionDims s =
      flash_attention_dims(kOp, q_view, k_view, v_view, doc_start_view, Device::kCpu);
  expect_flash_backward_views(kOp, s, dout_view, out_view, lse_view, dq_view, dk_view, dv_view,
                              Device::kCpu);
  const int64_t B = s.batch, T = s.seq, H = s.heads, KV = s.kv_heads, hd = s.head_dim;
  const float* dout = dout_view.data<float>(kOp);
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  const float* out = out_view.data<float>(kOp);
  const float* lse = lse_view.data<float>(kOp);
  float* dq = dq_view.data<float>(kOp);
  float* dk = dk_view.data<float>(kOp);
  float* dv = dv_view.data<float>(kOp);
  const int32_t* doc_start =
      doc_start_view.raw() != nullptr ? doc_start_view.data<int32_t>(kOp) : nullptr;
  check_doc_start_values(kOp, doc_start, s);
  const int64_t group = H / KV;
  const int64_t ldq = H * hd, ldkv = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t blocks = (T + kRowBlock - 1) / kRowBlock;

  // Parallel over (b, kv head), as causal_attention.cpp's backward: the query heads of one group
  // run in order inside one iteration, each over its query blocks in order, so every dk and dv
  // entry is summed by one thread in a fixed order (no atomics, no per-head copies) and the bits
  // do not depend on the thread count. Each query block computes its P and dS once and uses them
  // for dq and for its share of dk and dv. P and dS of one block: kRowBlock x T floats each.
  thread_local std::vector<float> p_scratch, ds_scratch;
#pragma omp parallel
  {
    float* const p = thread_scratch(p_scratch, kRowBlock * T);
    float* const ds = thread_scratch(ds_scratch, kRowBlock * T);
    // Blocks of a group do unequal work under document masking: dynamic scheduling balances them
    // (the results do not depend on it).
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        const int32_t* docs = doc_start != nullptr ? doc_start + b * T : nullptr;
        const float* kh = k + (b * T * KV + kvh) * hd;
        const float* vh = v + (b * T * KV + kvh) * hd;
        float* dkh = dk + (b * T * KV + kvh) * hd;
        float* dvh = dv + (b * T * KV + kvh) * hd;
        // Every key is attended by itself, so each dk/dv row receives at least one block's sum;
        // zeroed first so that all blocks add.
        for (int64_t t = 0; t < T; ++t) {
          std::fill(dkh + t * ldkv, dkh + t * ldkv + hd, 0.0f);
          std::fill(dvh + t * ldkv, dvh + t * ldkv + hd, 0.0f);
        }
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          const float* qh = q + (b * T * H + h) * hd;
          const float* doh = dout + (b * T * H + h) * hd;
          const float* oh = out + (b * T * H + h) * hd;
          const float* lse_h = lse + (b * H + h) * T;
          float* dqh = dq + (b * T * H + h) * hd;
          for (int64_t blk = 0; blk < blocks; ++blk) {
            // Query block [r0, r1) against keys [c_lo, r1).
            const int64_t r0 = blk * kRowBlock, r1 = std::min(r0 + kRowBlock, T), m = r1 - r0;
            const int64_t c_lo = first_key(docs, r0, r1), n = r1 - c_lo;
            gemm(precision, false, true, m, n, hd, 1.0f, qh + r0 * ldq, ldq, kh + c_lo * ldkv, ldkv,
                 0.0f, p, n);
            gemm(precision, false, true, m, n, hd, 1.0f, doh + r0 * ldq, ldq, vh + c_lo * ldkv,
                 ldkv, 0.0f, ds, n);
            for (int64_t i = r0; i < r1; ++i) {
              float* p_row = p + (i - r0) * n;
              probabilities_row(p_row, n, doc_start_at(docs, i) - c_lo, i + 1 - c_lo, scale,
                                lse_h[i]);
              ds_row(p_row, ds + (i - r0) * n, n, row_dot(doh + i * ldq, oh + i * ldq, hd));
            }
            // dQ[r0:r1] = scale (dS[r0:r1, c_lo:r1] K[c_lo:r1]).
            gemm(precision, false, false, m, hd, n, 1.0f, ds, n, kh + c_lo * ldkv, ldkv, 0.0f,
                 dqh + r0 * ldq, ldq);
            scale_rows(dqh + r0 * ldq, m, hd, ldq, scale);
            // dV[c_lo:r1] += P^T dO[r0:r1]; dK[c_lo:r1] += dS^T Q[r0:r1], scaled once complete.
            gemm(precision, true, false, n, hd, m, 1.0f, p, n, doh + r0 * ldq, ldq, 1.0f,
                 dvh + c_lo * ldkv, ldkv);
            gemm(precision, true, false, n, hd, m, 1.0f, ds, n, qh + r0 * ldq, ldq, 1.0f,
                 dkh + c_lo * ldkv, ldkv);
          }
        }
        scale_rows(dkh, T, hd, ldkv, scale);
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
