// Token embedding on the CPU: the forward copies rows over the OpenMP pool; the backward runs
// serially, because repeated tokens add into the same gradient row.
#include <algorithm>

#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

void check_tokens(const char* op, const int32_t* tokens, int64_t rows, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r)
    MOE_CHECK(tokens[r] >= 0 && tokens[r] < vocab, "[{}] token id {} at row {} is outside [0, {})",
              op, tokens[r], r, vocab);
}

}  // namespace

void embedding_forward(ConstTensorView tokens, ConstTensorView w, TensorView out) {
  constexpr const char* kOp = "embedding";
  MOE_CHECK(w.rank() == 2, "[{}] w must be [vocab, dim], got rank {}", kOp, w.rank());
  const int64_t rows = tokens.size(0), vocab = w.size(0), dim = w.size(1);
  expect_shape(kOp, "tokens", tokens, {rows});
  expect_shape(kOp, "w", w, {vocab, dim});
  expect_shape(kOp, "out", out, {rows, dim});
  const int32_t* tp = tokens.data<int32_t>(kOp);
  const float* wp = w.data<float>(kOp);
  float* op = out.data<float>(kOp);
  check_tokens(kOp, tp, rows, vocab);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::copy_n(wp + tp[r] * dim, dim, op + r * dim);
}

void embedding_backward(ConstTensorView tokens, ConstTensorView dout, TensorView dw,
                        int64_t padding_idx) {
  constexpr const char* kOp = "embedding_backward";
  MOE_CHECK(dw.rank() == 2, "[{}] dw must be [vocab, dim], got rank {}", kOp, dw.rank());
  const int64_t rows = tokens.size(0), vocab = dw.size(0), dim = dw.size(1);
  expect_shape(kOp, "tokens", tokens, {rows});
  expect_shape(kOp, "dout", dout, {rows, dim});
  expect_shape(kOp, "dw", dw, {vocab, dim});
  const int32_t* tp = tokens.data<int32_t>(kOp);
  const float* gp = dout.data<float>(kOp);
  float* dwp = dw.data<float>(kOp);
  check_tokens(kOp, tp, rows, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    if (tp[r] == padding_idx) continue;
    float* row = dwp + tp[r] * dim;
    const float* g = gp + r * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += g[j];
  }
}

}  // namespace moecore::kernels::cpu
