// CPU GEMM through oneDNN's sgemm, which runs on the same OpenMP pool as the rest of moecore
// (one thread pool: no BLAS threads fighting OpenMP for the cores). bf16 GEMMs are in
// gemm_bf16.cpp.
#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "core/check.h"
#include "kernels/cpu/gemm_k0.h"

namespace moecore::kernels {

void gemm_fp32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    cpu::scale_by_beta(m, n, beta, c, ldc);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  MOE_CHECK(status == dnnl_success, "[gemm] oneDNN sgemm failed (status {}) for m={} n={} k={}",
            static_cast<int>(status), m, n, k);
}

void gemm(MatmulPrecision precision, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  if (precision == MatmulPrecision::kBf16) {
    gemm_bf16(bf16_gemm_path(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_fp32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace moecore::kernels
