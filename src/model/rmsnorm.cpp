#include "model/rmsnorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace moecore {

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                     int64_t dim, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < dim; ++j) sum_sq += xr[j] * xr[j];
    const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    rstd[r] = s;
    for (int64_t j = 0; j < dim; ++j) yr[j] = w[j] * (xr[j] * s);
  }
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
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* dyr = dy + r * dim;
      float* dxr = dx + r * dim;
      const float s = rstd[r];
      float dot = 0.0f;
      for (int64_t j = 0; j < dim; ++j) {
        const float xhat = xr[j] * s;
        dot += dyr[j] * w[j] * xhat;
        my_dw[j] += dyr[j] * xhat;
      }
      const float mean_dot = dot / static_cast<float>(dim);
      for (int64_t j = 0; j < dim; ++j) {
        const float g = s * (dyr[j] * w[j] - xr[j] * s * mean_dot);
        dxr[j] = accumulate_dx ? dxr[j] + g : g;
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < dim; ++j) dw[j] += partial[static_cast<size_t>(t) * dim + j];
}

}  // namespace moecore
