#include "model/swiglu.h"

#include "core/simd.h"

namespace moecore {

namespace {

MOECORE_SIMD_CLONES void swiglu_forward_row(const float* g, const float* u, float* a,
                                            int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    a[j] = g[j] * sig * u[j];
  }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig)).
MOECORE_SIMD_CLONES void swiglu_backward_row(const float* da, const float* g, const float* u,
                                             float* dg, float* du, int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    const float silu = g[j] * sig;
    du[j] = da[j] * silu;
    dg[j] = da[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
  }
}

}  // namespace

void swiglu_forward(const float* gu, float* act, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    swiglu_forward_row(g, g + hidden, act + r * hidden, hidden);
  }
}

void swiglu_backward(const float* dact, const float* gu, float* dgu, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    float* dg = dgu + r * 2 * hidden;
    swiglu_backward_row(dact + r * hidden, g, g + hidden, dg, dg + hidden, hidden);
  }
}

}  // namespace moecore
