// RMSNorm on the CPU: rows over the OpenMP pool, each row's sum of squares in kSumLanes lanes
// (core/simd.h: a fixed order, the same bits from every SIMD clone).
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

// Sum of squares of one row in lanes (lane_sum: a fixed order), then y = w * (x * rstd).
MOECORE_SIMD_CLONES float rmsnorm_forward_row(const float* x, const float* w, float* y, int64_t dim,
                                              float eps) {
  const float sum_sq = lane_sum(dim, [x](int64_t j) { return x[j] * x[j]; });
  const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t j = 0; j < dim; ++j) y[j] = w[j] * (x[j] * s);
  return s;
}

// One row's dx (overwritten or accumulated) and its contribution to dw.
MOECORE_SIMD_CLONES void rmsnorm_backward_row(const float* dy, const float* x, const float* w,
                                              float s, float* dx, float* dw, int64_t dim,
                                              bool accumulate_dx) {
  const float dot = lane_sum(dim, [dy, w, x, s](int64_t j) { return dy[j] * w[j] * (x[j] * s); });
  for (int64_t j = 0; j < dim; ++j) dw[j] += dy[j] * (x[j] * s);
  const float mean_dot = dot / static_cast<float>(dim);
  if (accumulate_dx) {
    for (int64_t j = 0; j < dim; ++j) dx[j] += s * (dy[j] * w[j] - x[j] * s * mean_dot);
  } else {
    for (int64_t j = 0; j < dim; ++j) dx[j] = s * (dy[j] * w[j] - x[j] * s * mean_dot);
  }
}

}  // namespace

void rmsnorm_forward(ConstTensorView x, ConstTensorView w, TensorView y, TensorView rstd,
                     float eps) {
  constexpr const char* kOp = "rmsnorm";
  MOE_CHECK(x.rank() == 2, "[{}] x must be [rows, dim], got rank {}", kOp, x.rank());
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape(kOp, "x", x, {rows, dim});
  expect_shape(kOp, "w", w, {dim});
  expect_shape(kOp, "y", y, {rows, dim});
  expect_shape(kOp, "rstd", rstd, {rows});
  const float* xp = x.data<float>(kOp);
  const float* wp = w.data<float>(kOp);
  float* yp = y.data<float>(kOp);
  float* rp = rstd.data<float>(kOp);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    rp[r] = rmsnorm_forward_row(xp + r * dim, wp, yp + r * dim, dim, eps);
}

// With xhat = x * rstd: dx = rstd * (dy*w - xhat * mean(dy*w*xhat)), dw = sum_rows dy * xhat.
// dw is reduced through per-thread partial sums (fixed order for a fixed thread count).
void rmsnorm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                      ConstTensorView rstd, TensorView dx, TensorView dw, bool accumulate_dx) {
  constexpr const char* kOp = "rmsnorm_backward";
  MOE_CHECK(x.rank() == 2, "[{}] x must be [rows, dim], got rank {}", kOp, x.rank());
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape(kOp, "dy", dy, {rows, dim});
  expect_shape(kOp, "x", x, {rows, dim});
  expect_shape(kOp, "w", w, {dim});
  expect_shape(kOp, "rstd", rstd, {rows});
  expect_shape(kOp, "dx", dx, {rows, dim});
  expect_shape(kOp, "dw", dw, {dim});
  const float* dyp = dy.data<float>(kOp);
  const float* xp = x.data<float>(kOp);
  const float* wp = w.data<float>(kOp);
  const float* rp = rstd.data<float>(kOp);
  float* dxp = dx.data<float>(kOp);
  float* dwp = dw.data<float>(kOp);
  const int threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * static_cast<size_t>(dim), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float* my_dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * dim;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      rmsnorm_backward_row(dyp + r * dim, xp + r * dim, wp, rp[r], dxp + r * dim, my_dw, dim,
                           accumulate_dx);
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < dim; ++j) dwp[j] += partial[static_cast<size_t>(t) * dim + j];
}

}  // namespace moecore::kernels::cpu
