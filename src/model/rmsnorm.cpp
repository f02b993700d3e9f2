#include "model/rmsnorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/simd.h"

namespace moecore {

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

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                     int64_t dim, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    rstd[r] = rmsnorm_forward_row(x + r * dim, w, y + r * dim, dim, eps);
}

// With xhat = x * rstd: dx = rstd * (dy*w - xhat * mean(dy*w*xhat)), dw = sum_rows dy * xhat.
// dw is reduced through per-thread partial sums (fixed order for a fixed thread count).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t rows, int64_t dim, bool accumulate_dx) {
  const int threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * static_cast<size_t>(dim), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float* my_dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * dim;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      rmsnorm_backward_row(dy + r * dim, x + r * dim, w, rstd[r], dx + r * dim, my_dw, dim,
                           accumulate_dx);
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < dim; ++j) dw[j] += partial[static_cast<size_t>(t) * dim + j];
}

}  // namespace moecore
