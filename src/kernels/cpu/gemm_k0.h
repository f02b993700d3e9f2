// C = beta * C, the defined result of a GEMM with k == 0 (oneDNN requires k > 0). beta == 0
// writes zeros without reading C, as BLAS does, so NaN in an uninitialised C does not survive.
#pragma once

#include <cstdint>

namespace moecore::kernels::cpu {

inline void scale_by_beta(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

}  // namespace moecore::kernels::cpu
