// cuBLASLt is column-major: a row-major [r, c] matrix is the column-major [c, r] one with the same
// bytes, so the row-major c = op(a) op(b) is issued as the column-major c^T = op(b)^T op(a)^T:
// b's storage is cuBLASLt's first operand and a's its second, each with its own transpose flag.
#include "kernels/cuda/gemm_lt.h"

#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/lt_descriptors.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

using lt::alignment_of;
using lt::Layout;
using lt::MatmulDesc;
using lt::Preference;

void gemm_lt(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void* a, const void* b, cudaDataType_t operand_type, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c (cuBLASLt has no kernel for k = 0)
    if (beta == 0.0f) {
      MOE_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(m * n) * sizeof(float), stream()));
    } else {
      launch_scale(c, beta, c, m * n, stream());
      MOE_CUDA_CHECK(cudaGetLastError());
    }
    return;
  }
  MatmulDesc op;
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  const Layout b_layout(operand_type, trans_b ? k : n, trans_b ? n : k);
  const Layout a_layout(operand_type, trans_a ? m : k, trans_a ? k : m);
  const Layout c_layout(CUDA_R_32F, n, m);

  Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kGemmWorkspaceBytes);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(b));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(a));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(c));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(c));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(), op.get(), b_layout.get(), a_layout.get(), c_layout.get(), c_layout.get(),
      preference.get(), 1, &heuristic, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    // cuBLASLt's kernels want leading dimensions and addresses aligned for vector loads; an odd
    // extent (a test's 7 x 17, a vocabulary of odd size) may leave none. cuBLAS's general GEMM
    // takes any layout, with the same column-major mapping and fp32 accumulation (and int extents).
    MOE_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX,
              "[gemm] m={} n={} k={}: an extent beyond 2^31 - 1 for cuBLAS's general GEMM", m, n,
              k);
    MOE_CUBLAS_CHECK(cublasGemmEx(
        cublas_handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, operand_type,
        static_cast<int>(trans_b ? k : n), a, operand_type, static_cast<int>(trans_a ? m : k),
        &beta, c, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  MOE_CUBLAS_CHECK(status);
  MOE_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), op.get(), &alpha, b, b_layout.get(), a,
                                  a_layout.get(), &beta, c, c_layout.get(), c, c_layout.get(),
                                  &heuristic.algo, gemm_workspace(), kGemmWorkspaceBytes,
                                  stream()));
}

}  // namespace moecore::kernels::cuda
