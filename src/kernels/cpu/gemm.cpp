// CPU GEMM through oneDNN's sgemm, which runs on the same OpenMP pool as the rest of moecore
// (one thread pool: no BLAS threads fighting OpenMP for the cores).
#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "core/check.h"

namespace moecore::kernels {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // oneDNN requires k > 0; C = beta * C is the defined result.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  MOE_CHECK(status == dnnl_success, "[gemm] oneDNN sgemm failed (status {}) for m={} n={} k={}",
            static_cast<int>(status), m, n, k);
}

}  // namespace moecore::kernels
