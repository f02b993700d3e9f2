#include "model/swiglu.h"

#include <cmath>

namespace moecore {

void swiglu_forward(const float* gu, float* act, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    const float* u = g + hidden;
    float* a = act + r * hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      const float sig = 1.0f / (1.0f + std::exp(-g[j]));
      a[j] = g[j] * sig * u[j];
    }
  }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig)).
void swiglu_backward(const float* dact, const float* gu, float* dgu, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    const float* u = g + hidden;
    const float* da = dact + r * hidden;
    float* dg = dgu + r * 2 * hidden;
    float* du = dg + hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      const float sig = 1.0f / (1.0f + std::exp(-g[j]));
      const float silu = g[j] * sig;
      du[j] = da[j] * silu;
      dg[j] = da[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
    }
  }
}

}  // namespace moecore
