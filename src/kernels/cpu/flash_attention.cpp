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
// In bf16 the GEMMs read q, k, v (and dout) from bf16 copies made once per call, each head's rows
// contiguous: a query block's GEMMs would otherwise convert every key and value row it meets
// again, (T / 64 + 1) / 2 times each over a sequence of T (2.5 times at 256 positions, 16.5 at
// 2048), and the conversions cost more than the block GEMMs themselves (measured on an AMX
// Xeon: perf put a quarter of the bf16 step's conversions here). dS, which two GEMMs read, is
// converted once too. The values rounded are the same, so are the products and the bits. Only on
// the native bf16 path: the emulated one multiplies fp32 values, so a bf16 copy would be widened
// again for every GEMM, and its GEMMs round their operands as before.
//
// Every GEMM here runs with alpha = 1 and the softmax scale 1/sqrt(hd) is applied in fp32 around
// it (to the scores, to dq, to the finished dk): oneDNN's bf16 matmul with an output scale runs
// 3-5x slower on these shapes (measured: 64x128x64 in 49 us against 16 us without one).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch_vector.h"
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

// x [batch, seq, heads, hd] rounded to bf16 into `copy` as [batch, heads, seq, hd] (each head's
// rows contiguous, as the bf16 GEMMs take an operand); `copy` keeps its capacity across calls.
const uint16_t* heads_to_bf16(std::vector<uint16_t>& copy, const float* x, int64_t batch,
                              int64_t seq, int64_t heads, int64_t hd) {
  uint16_t* const dst = scratch_of_at_least(copy, batch * seq * heads * hd);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      convert_to_bf16(x + (b * seq * heads + h) * hd, seq, hd, heads * hd,
                      dst + (b * heads + h) * seq * hd);
  return dst;
}

// The calling thread's bf16 copies (heads_to_bf16) of q, k, v and dout, shared by the forward and
// the backward and kept for the next call.
struct HeadCopies {
  std::vector<uint16_t> q, k, v, dout;
};
HeadCopies& head_copies() {
  thread_local HeadCopies copies;
  return copies;
}

// One head's rows of q, k, v or dout as the block GEMMs read them: the fp32 rows (row stride ld)
// and their bf16 copy (row stride hd) where gemms_read_bf16_bits, else nullptr.
struct HeadRows {
  const float* values;
  int64_t ld;
  const uint16_t* bf16;
  int64_t hd;
  HeadRows from(int64_t row) const {
    return {values + row * ld, ld, bf16 != nullptr ? bf16 + row * hd : nullptr, hd};
  }
};

// The head's rows of one (batch, head): fp32 from x [batch, seq, heads, hd], bf16 from
// heads_to_bf16's copy of it (or none).
HeadRows head_rows(const float* x, const uint16_t* copy, int64_t b, int64_t h, int64_t seq,
                   int64_t heads, int64_t hd) {
  return {x + (b * seq * heads + h) * hd, heads * hd,
          copy != nullptr ? copy + (b * heads + h) * seq * hd : nullptr, hd};
}

// c[m, n] = x[0:m] y[0:n]^T (the scores, or dP), row stride n.
void head_products(MatmulPrecision precision, const HeadRows& x, const HeadRows& y, int64_t m,
                   int64_t n, float* c) {
  if (x.bf16 != nullptr) {
    gemm_bf16_ab16(bf16_gemm_path(), false, true, m, n, x.hd, 1.0f, x.bf16, y.bf16, 0.0f, c, n);
  } else {
    gemm(precision, false, true, m, n, x.hd, 1.0f, x.values, x.ld, y.values, y.ld, 0.0f, c, n);
  }
}

// A block [m, n] (row stride n) of P or dS: fp32, and its bf16 copy where two GEMMs read it (and
// gemms_read_bf16_bits).
struct BlockMatrix {
  const float* values;
  const uint16_t* bf16;
};

// c = op(s) y + beta c with s a block [m, n]: c[m, hd] = s y[0:n] (trans false), or c[n, hd] =
// s^T y[0:m] (trans true); c has row stride ldc.
void block_times_head(MatmulPrecision precision, bool trans, const BlockMatrix& s, int64_t m,
                      int64_t n, const HeadRows& y, float beta, float* c, int64_t ldc) {
  const int64_t rows = trans ? n : m, inner = trans ? m : n;
  if (y.bf16 == nullptr) {
    gemm(precision, trans, false, rows, y.hd, inner, 1.0f, s.values, n, y.values, y.ld, beta, c,
         ldc);
  } else if (s.bf16 != nullptr) {
    gemm_bf16_ab16(bf16_gemm_path(), trans, false, rows, y.hd, inner, 1.0f, s.bf16, y.bf16, beta, c,
                   ldc);
  } else {
    gemm_bf16_b16(bf16_gemm_path(), trans, false, rows, y.hd, inner, 1.0f, s.values, n, y.bf16,
                  beta, c, ldc);
  }
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
  const int64_t ldq = H * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t blocks = (T + kRowBlock - 1) / kRowBlock;
  const bool bf16 = gemms_read_bf16_bits(precision);
  HeadCopies& copies = head_copies();
  const uint16_t* const q16 = bf16 ? heads_to_bf16(copies.q, q, B, T, H, hd) : nullptr;
  const uint16_t* const k16 = bf16 ? heads_to_bf16(copies.k, k, B, T, KV, hd) : nullptr;
  const uint16_t* const v16 = bf16 ? heads_to_bf16(copies.v, v, B, T, KV, hd) : nullptr;

  // Scores of one query block against keys [c_lo, r1): kRowBlock x T floats per thread.
  thread_local std::vector<float> score_scratch;
  // Every (b, h, query block) writes disjoint out rows and lse entries. Later blocks have more
  // keys: dynamic scheduling balances them (the results do not depend on it).
#pragma omp parallel
  {
    float* const p = scratch_of_at_least(score_scratch, kRowBlock * T);
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t kvh = h / group;
          const int64_t r0 = blk * kRowBlock, r1 = std::min(r0 + kRowBlock, T);
          const int32_t* docs = doc_start != nullptr ? doc_start + b * T : nullptr;
          const int64_t c_lo = first_key(docs, r0, r1), n = r1 - c_lo;
          const HeadRows qh = head_rows(q, q16, b, h, T, H, hd);
          const HeadRows kh = head_rows(k, k16, b, kvh, T, KV, hd);
          const HeadRows vh = head_rows(v, v16, b, kvh, T, KV, hd);
          float* oh = out + (b * T * H + h) * hd;
          // q[r0:r1] k[c_lo:r1]^T (row stride n); the softmax scales it.
          head_products(precision, qh.from(r0), kh.from(c_lo), r1 - r0, n, p);
          for (int64_t i = r0; i < r1; ++i)
            lse[(b * H + h) * T + i] =
                softmax_row(p + (i - r0) * n, n, doc_start_at(docs, i) - c_lo, i + 1 - c_lo, scale);
          // out[r0:r1] = P[r0:r1, c_lo:r1] v[c_lo:r1].
          block_times_head(precision, false, {p, nullptr}, r1 - r0, n, vh.from(c_lo), 0.0f,
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
  const bool bf16 = gemms_read_bf16_bits(precision);
  HeadCopies& copies = head_copies();
  const uint16_t* const q16 = bf16 ? heads_to_bf16(copies.q, q, B, T, H, hd) : nullptr;
  const uint16_t* const k16 = bf16 ? heads_to_bf16(copies.k, k, B, T, KV, hd) : nullptr;
  const uint16_t* const v16 = bf16 ? heads_to_bf16(copies.v, v, B, T, KV, hd) : nullptr;
  const uint16_t* const dout16 = bf16 ? heads_to_bf16(copies.dout, dout, B, T, H, hd) : nullptr;

  // Parallel over (b, kv head), as causal_attention.cpp's backward: the query heads of one group
  // run in order inside one iteration, each over its query blocks in order, so every dk and dv
  // entry is summed by one thread in a fixed order (no atomics, no per-head copies) and the bits
  // do not depend on the thread count. Each query block computes its P and dS once and uses them
  // for dq and for its share of dk and dv. P and dS of one block: kRowBlock x T floats each.
  thread_local std::vector<float> p_scratch, ds_scratch;
  thread_local std::vector<uint16_t> ds_copy;
#pragma omp parallel
  {
    float* const p = scratch_of_at_least(p_scratch, kRowBlock * T);
    float* const ds = scratch_of_at_least(ds_scratch, kRowBlock * T);
    uint16_t* const ds16 = bf16 ? scratch_of_at_least(ds_copy, kRowBlock * T) : nullptr;
    // Blocks of a group do unequal work under document masking: dynamic scheduling balances them
    // (the results do not depend on it).
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t kvh = 0; kvh < KV; ++kvh) {
        const int32_t* docs = doc_start != nullptr ? doc_start + b * T : nullptr;
        const HeadRows kh = head_rows(k, k16, b, kvh, T, KV, hd);
        const HeadRows vh = head_rows(v, v16, b, kvh, T, KV, hd);
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
          const HeadRows qh = head_rows(q, q16, b, h, T, H, hd);
          const HeadRows doh = head_rows(dout, dout16, b, h, T, H, hd);
          const float* oh = out + (b * T * H + h) * hd;
          const float* lse_h = lse + (b * H + h) * T;
          float* dqh = dq + (b * T * H + h) * hd;
          for (int64_t blk = 0; blk < blocks; ++blk) {
            // Query block [r0, r1) against keys [c_lo, r1).
            const int64_t r0 = blk * kRowBlock, r1 = std::min(r0 + kRowBlock, T), m = r1 - r0;
            const int64_t c_lo = first_key(docs, r0, r1), n = r1 - c_lo;
            head_products(precision, qh.from(r0), kh.from(c_lo), m, n, p);
            head_products(precision, doh.from(r0), vh.from(c_lo), m, n, ds);
            for (int64_t i = r0; i < r1; ++i) {
              float* p_row = p + (i - r0) * n;
              probabilities_row(p_row, n, doc_start_at(docs, i) - c_lo, i + 1 - c_lo, scale,
                                lse_h[i]);
              ds_row(p_row, ds + (i - r0) * n, n, row_dot(doh.values + i * ldq, oh + i * ldq, hd));
            }
            // dS is read twice (dq and dk): rounded once.
            if (bf16) convert_to_bf16(ds, m, n, n, ds16);
            const BlockMatrix ds_block{ds, ds16}, p_block{p, nullptr};
            // dQ[r0:r1] = scale (dS[r0:r1, c_lo:r1] K[c_lo:r1]).
            block_times_head(precision, false, ds_block, m, n, kh.from(c_lo), 0.0f, dqh + r0 * ldq,
                             ldq);
            scale_rows(dqh + r0 * ldq, m, hd, ldq, scale);
            // dV[c_lo:r1] += P^T dO[r0:r1]; dK[c_lo:r1] += dS^T Q[r0:r1], scaled once complete.
            block_times_head(precision, true, p_block, m, n, doh.from(r0), 1.0f, dvh + c_lo * ldkv,
                             ldkv);
            block_times_head(precision, true, ds_block, m, n, qh.from(r0), 1.0f, dkh + c_lo * ldkv,
                             ldkv);
          }
        }
        scale_rows(dkh, T, hd, ldkv, scale);
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
