// Routed-row permutations on the CPU: rows over the OpenMP pool, each a contiguous copy (or, in
// the backward, a sum over a token's routes in route order, so the result does not depend on the
// thread count).
#include <algorithm>

#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

// Every index of `rows` is a row of a tensor with `limit` rows (or, from lowest = -1, an empty
// slot).
void check_rows(const char* op, const char* name, const int32_t* rows, int64_t count, int64_t limit,
                int32_t lowest = 0) {
  for (int64_t i = 0; i < count; ++i)
    MOE_CHECK(rows[i] >= lowest && rows[i] < limit, "[{}] {}[{}]={} is outside [{}, {})", op, name,
              i, rows[i], lowest, limit);
}

}  // namespace

void permute_rows(ConstTensorView src, ConstTensorView dst_row, int64_t routes_per_row,
                  TensorView dst) {
  constexpr const char* kOp = "permute_rows";
  MOE_CHECK(dst.rank() == 2 && routes_per_row > 0,
            "[{}] dst must be [rows, d] and routes_per_row={} positive", kOp, routes_per_row);
  const int64_t routes = dst_row.size(0), d = dst.size(1);
  MOE_CHECK(routes % routes_per_row == 0, "[{}] {} routes are not {} per source row", kOp, routes,
            routes_per_row);
  expect_shape(kOp, "dst_row", dst_row, {routes});
  expect_shape(kOp, "src", src, {routes / routes_per_row, d});
  expect_shape(kOp, "dst", dst, {dst.size(0), d});
  const float* s = src.data<float>(kOp);
  const int32_t* to = dst_row.data<int32_t>(kOp);
  float* out = dst.data<float>(kOp);
  check_rows(kOp, "dst_row", to, routes, dst.size(0));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < routes; ++r)
    std::copy_n(s + (r / routes_per_row) * d, d, out + to[r] * d);
}

void permute_rows_backward(ConstTensorView d_dst, ConstTensorView dst_row, int64_t routes_per_row,
                           TensorView d_src) {
  constexpr const char* kOp = "permute_rows_backward";
  MOE_CHECK(d_src.rank() == 2 && routes_per_row > 0,
            "[{}] d_src must be [rows, d] and routes_per_row={} positive", kOp, routes_per_row);
  const int64_t tokens = d_src.size(0), d = d_src.size(1), k = routes_per_row;
  expect_shape(kOp, "dst_row", dst_row, {tokens * k});
  expect_shape(kOp, "d_dst", d_dst, {d_dst.size(0), d});
  const float* g = d_dst.data<float>(kOp);
  const int32_t* from = dst_row.data<int32_t>(kOp);
  float* dx = d_src.data<float>(kOp);
  check_rows(kOp, "dst_row", from, tokens * k, d_dst.size(0));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* dxt = dx + t * d;
    std::fill(dxt, dxt + d, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* src = g + from[t * k + j] * d;
      for (int64_t i = 0; i < d; ++i) dxt[i] += src[i];
    }
  }
}

void gather_rows(ConstTensorView src, ConstTensorView src_row, TensorView dst) {
  constexpr const char* kOp = "gather_rows";
  MOE_CHECK(dst.rank() == 2, "[{}] dst must be [rows, d], got rank {}", kOp, dst.rank());
  const int64_t rows = dst.size(0), d = dst.size(1);
  expect_shape(kOp, "src_row", src_row, {rows});
  expect_shape(kOp, "src", src, {src.size(0), d});
  expect_shape(kOp, "dst", dst, {rows, d});
  const float* s = src.data<float>(kOp);
  const int32_t* from = src_row.data<int32_t>(kOp);
  float* out = dst.data<float>(kOp);
  check_rows(kOp, "src_row", from, rows, src.size(0), -1);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    if (from[i] == -1)
      std::fill_n(out + i * d, d, 0.0f);
    else
      std::copy_n(s + from[i] * d, d, out + i * d);
  }
}

}  // namespace moecore::kernels::cpu
