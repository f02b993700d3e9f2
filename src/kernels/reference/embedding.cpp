// Token embedding, the plain-loop oracle.
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void embedding_forward(ConstTensorView tokens, ConstTensorView w, TensorView out) {
  const int64_t rows = tokens.size(0), vocab = w.size(0), dim = w.size(1);
  expect_shape("embedding", "out", out, {rows, dim});
  const int32_t* tp = tokens.data<int32_t>("embedding");
  const float* wp = w.data<float>("embedding");
  float* op = out.data<float>("embedding");
  for (int64_t r = 0; r < rows; ++r) {
    MOE_CHECK(tp[r] >= 0 && tp[r] < vocab, "[embedding] token id {} is outside [0, {})", tp[r],
              vocab);
    for (int64_t j = 0; j < dim; ++j) op[r * dim + j] = wp[tp[r] * dim + j];
  }
}

void embedding_backward(ConstTensorView tokens, ConstTensorView dout, TensorView dw,
                        int64_t padding_idx) {
  const int64_t rows = tokens.size(0), vocab = dw.size(0), dim = dw.size(1);
  expect_shape("embedding_backward", "dout", dout, {rows, dim});
  const int32_t* tp = tokens.data<int32_t>("embedding_backward");
  const float* gp = dout.data<float>("embedding_backward");
  float* dwp = dw.data<float>("embedding_backward");
  for (int64_t r = 0; r < rows; ++r) {
    MOE_CHECK(tp[r] >= 0 && tp[r] < vocab, "[embedding_backward] token id {} is outside [0, {})",
              tp[r], vocab);
    if (tp[r] == padding_idx) continue;
    for (int64_t j = 0; j < dim; ++j) dwp[tp[r] * dim + j] += gp[r * dim + j];
  }
}

}  // namespace moecore::kernels::reference
