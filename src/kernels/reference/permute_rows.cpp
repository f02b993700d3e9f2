// Routed-row permutations, the plain-loop oracle.
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void permute_rows(ConstTensorView src, ConstTensorView dst_row, int64_t routes_per_row,
                  TensorView dst) {
  const int64_t routes = dst_row.size(0), d = dst.size(1);
  const float* s = src.data<float>("permute_rows");
  const int32_t* to = dst_row.data<int32_t>("permute_rows");
  float* out = dst.data<float>("permute_rows");
  for (int64_t r = 0; r < routes; ++r)
    for (int64_t i = 0; i < d; ++i) out[to[r] * d + i] = s[(r / routes_per_row) * d + i];
}

void permute_rows_backward(ConstTensorView d_dst, ConstTensorView dst_row, int64_t routes_per_row,
                           TensorView d_src) {
  const int64_t tokens = d_src.size(0), d = d_src.size(1);
  const float* g = d_dst.data<float>("permute_rows_backward");
  const int32_t* from = dst_row.data<int32_t>("permute_rows_backward");
  float* dx = d_src.data<float>("permute_rows_backward");
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < d; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < routes_per_row; ++j)
        sum += double{g[from[t * routes_per_row + j] * d + i]};
      dx[t * d + i] = static_cast<float>(sum);
    }
}

void gather_rows(ConstTensorView src, ConstTensorView src_row, TensorView dst) {
  const int64_t rows = dst.size(0), d = dst.size(1);
  const float* s = src.data<float>("gather_rows");
  const int32_t* from = src_row.data<int32_t>("gather_rows");
  float* out = dst.data<float>("gather_rows");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = from[r] == -1 ? 0.0f : s[from[r] * d + i];
}

}  // namespace moecore::kernels::reference
