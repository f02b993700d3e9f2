// Causal attention, the plain-loop oracle, from the definition in double: per query row a softmax
// over keys [start, i] of q.k / sqrt(hd), then the probability-weighted sum of v. fp32 operands
// only: it has no bf16 rounding of its GEMM operands.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void causal_attention_forward(ConstTensorView q_view, ConstTensorView k_view,
                              ConstTensorView v_view, TensorView out_view, TensorView probs_view,
                              ConstTensorView doc_start_view, MatmulPrecision precision) {
  constexpr const char* kOp = "attention";
  MOE_CHECK(precision == MatmulPrecision::kFp32, "[{}] the reference oracle is fp32 only", kOp);
  const int64_t B = q_view.size(0), T = q_view.size(1), H = q_view.size(2), hd = q_view.size(3);
  const int64_t KV = k_view.size(2), group = H / KV;
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  float* out = out_view.data<float>(kOp);
  float* probs = probs_view.data<float>(kOp);
  const int32_t* doc_start =
      doc_start_view.raw() != nullptr ? doc_start_view.data<int32_t>(kOp) : nullptr;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> w(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kvh = h / group;
        const int64_t start = doc_start != nullptr ? doc_start[b * T + i] : 0;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = start; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            dot += double{q[((b * T + i) * H + h) * hd + d]} *
                   double{k[((b * T + j) * KV + kvh) * hd + d]};
          w[static_cast<size_t>(j)] = dot * scale;
          max_score = std::max(max_score, w[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = start; j <= i; ++j)
          sum += (w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - max_score));
        float* p_row = probs + ((b * H + h) * T + i) * T;
        std::fill(p_row, p_row + T, 0.0f);
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = start; j <= i; ++j)
            acc += w[static_cast<size_t>(j)] / sum * double{v[((b * T + j) * KV + kvh) * hd + d]};
          out[((b * T + i) * H + h) * hd + d] = static_cast<float>(acc);
        }
        for (int64_t j = start; j <= i; ++j)
          p_row[j] = static_cast<float>(w[static_cast<size_t>(j)] / sum);
      }
}

// dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q.
void causal_attention_backward(ConstTensorView dout_view, ConstTensorView q_view,
                               ConstTensorView k_view, ConstTensorView v_view,
                               ConstTensorView probs_view, TensorView dq_view, TensorView dk_view,
                               TensorView dv_view, MatmulPrecision precision) {
  constexpr const char* kOp = "attention_backward";
  MOE_CHECK(precision == MatmulPrecision::kFp32, "[{}] the reference oracle is fp32 only", kOp);
  const int64_t B = q_view.size(0), T = q_view.size(1), H = q_view.size(2), hd = q_view.size(3);
  const int64_t KV = k_view.size(2), group = H / KV;
  const float* dout = dout_view.data<float>(kOp);
  const float* q = q_view.data<float>(kOp);
  const float* k = k_view.data<float>(kOp);
  const float* v = v_view.data<float>(kOp);
  const float* probs = probs_view.data<float>(kOp);
  std::vector<double> dq(static_cast<size_t>(dq_view.numel()), 0.0);
  std::vector<double> dk(static_cast<size_t>(dk_view.numel()), 0.0);
  std::vector<double> dv(static_cast<size_t>(dv_view.numel()), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kvh = h / group;
        const float* p_row = probs + ((b * H + h) * T + i) * T;
        const float* do_row = dout + ((b * T + i) * H + h) * hd;
        double row_dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            acc += double{do_row[d]} * double{v[((b * T + j) * KV + kvh) * hd + d]};
          dp[static_cast<size_t>(j)] = acc;
          row_dot += double{p_row[j]} * acc;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = double{p_row[j]};
          const double ds = p * (dp[static_cast<size_t>(j)] - row_dot) * scale;
          for (int64_t d = 0; d < hd; ++d) {
            const int64_t kv_index = ((b * T + j) * KV + kvh) * hd + d;
            const int64_t q_index = ((b * T + i) * H + h) * hd + d;
            dv[static_cast<size_t>(kv_index)] += p * double{do_row[d]};
            dq[static_cast<size_t>(q_index)] += ds * double{k[kv_index]};
            dk[static_cast<size_t>(kv_index)] += ds * double{q[q_index]};
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
