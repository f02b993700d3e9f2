// Flash attention, the plain-loop oracle, from the definition in double: per query row the scores
// over keys [start, i] of q.k / sqrt(hd), their logsumexp, and the probabilities exp(score - lse)
// computed on the fly (one row at a time, nothing T x T). In bf16 precision the GEMM operands are
// rounded where the CPU backend rounds them (kernels/cpu/flash_attention.cpp): q and k for the
// scores, the probabilities (as fp32) and v for out; dout and v for dP, P and dout for dv, dS (as
// fp32, before the 1 / sqrt(hd) scale) and k for dq, dS and q for dk.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "kernels/flash_attention_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels::reference {

namespace {

// A GEMM operand as the precision reads it: in bf16, the value as fp32 (as the backends hold it)
// rounded to bf16; in fp32, as it is (the oracle keeps its intermediates in double).
double operand(double value, bool bf16) {
  return bf16 ? double{round_to_bf16(static_cast<float>(value))} : value;
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
  const int64_t group = H / KV;
  const bool bf16 = precision == MatmulPrecision::kBf16;
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  float* out = out_view.data<float>(kOp);
  float* lse = lse_view.data<float>(kOp);
  const int32_t* doc_start =
      doc_start_view.raw() != nullptr ? doc_start_view.data<int32_t>(kOp) : nullptr;
  check_doc_start_values(kOp, doc_start, s);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> score(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kvh = h / group;
        const int64_t start = doc_start != nullptr ? doc_start[b * T + i] : 0;
        const float* q_row = q + ((b * T + i) * H + h) * hd;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = start; j <= i; ++j) {
          const float* k_row = k + ((b * T + j) * KV + kvh) * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += operand(q_row[d], bf16) * operand(k_row[d], bf16);
          score[static_cast<size_t>(j)] = dot * scale;
          max_score = std::max(max_score, score[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = start; j <= i; ++j)
          sum += std::exp(score[static_cast<size_t>(j)] - max_score);
        const double row_lse = max_score + std::log(sum);
        lse[(b * H + h) * T + i] = static_cast<float>(row_lse);
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = start; j <= i; ++j)
            acc += operand(std::exp(score[static_cast<size_t>(j)] - row_lse), bf16) *
                   operand(v[((b * T + j) * KV + kvh) * hd + d], bf16);
          out[((b * T + i) * H + h) * hd + d] = static_cast<float>(acc);
        }
      }
}

// P = exp(S - lse), D_i = dout_i . out_i, dP = dO V^T, dS = P (dP - D); dV = P^T dO,
// dQ = scale dS K, dK = scale dS^T Q, summed over the query heads of each kv head.
void flash_attention_backward(ConstTensorView dout_view, ConstTensorView q_view,
                              ConstTensorView k_view, ConstTensorView v_view,
                              ConstTensorView out_view, ConstTensorView lse_view,
                              ConstTensorView doc_start_view, TensorView dq_view,
                              TensorView dk_view, TensorView dv_view, MatmulPrecision precision) {
  constexpr const char* kOp = "flash_attention_backward";
  const FlashAttentionDims s =
      flash_attention_dims(kOp, q_view, k_view, v_view, doc_start_view, Device::kCpu);
  expect_flash_backward_views(kOp, s, dout_view, out_view, lse_view, dq_view, dk_view, dv_view,
                              Device::kCpu);
  const int64_t B = s.batch, T = s.seq, H = s.heads, KV = s.kv_heads, hd = s.head_dim;
  const int64_t group = H / KV;
  const bool bf16 = precision == MatmulPrecision::kBf16;
  const float* dout = dout_view.data<float>(kOp);
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  const float* out = out_view.data<float>(kOp);
  const float* lse = lse_view.data<float>(kOp);
  const int32_t* doc_start =
      doc_start_view.raw() != nullptr ? doc_start_view.data<int32_t>(kOp) : nullptr;
  check_doc_start_values(kOp, doc_start, s);
  std::vector<double> dq(static_cast<size_t>(dq_view.numel()), 0.0);
  std::vector<double> dk(static_cast<size_t>(dk_view.numel()), 0.0);
  std::vector<double> dv(static_cast<size_t>(dv_view.numel()), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kvh = h / group;
        const int64_t start = doc_start != nullptr ? doc_start[b * T + i] : 0;
        const int64_t q_base = ((b * T + i) * H + h) * hd;
        const double row_lse = double{lse[(b * H + h) * T + i]};
        double row_dot = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          row_dot += double{dout[q_base + d]} * double{out[q_base + d]};
        for (int64_t j = start; j <= i; ++j) {
          const int64_t kv_base = ((b * T + j) * KV + kvh) * hd;
          double dot = 0.0, dp = 0.0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += operand(q[q_base + d], bf16) * operand(k[kv_base + d], bf16);
            dp += operand(dout[q_base + d], bf16) * operand(v[kv_base + d], bf16);
          }
          const double p = std::exp(dot * scale - row_lse);
          const double ds = operand(p * (dp - row_dot), bf16);
          const double p_op = operand(p, bf16);
          for (int64_t d = 0; d < hd; ++d) {
            dv[static_cast<size_t>(kv_base + d)] += p_op * operand(dout[q_base + d], bf16);
            dq[static_cast<size_t>(q_base + d)] += scale * ds * operand(k[kv_base + d], bf16);
            dk[static_cast<size_t>(kv_base + d)] += scale * ds * operand(q[q_base + d], bf16);
          }
        }
      }
  auto store = [&](const std::vector<double>& from, TensorView to) {
    float* data = to.data<float>(kOp);
    for (size_t i = 0; i < from.size(); ++i) data[i] = static_cast<float>(from[i]);
  };
  store(dq, dq_view);
  store(dk, dk_view);
  store(dv, dv_view);
}

}  // namespace moecore::kernels::reference
