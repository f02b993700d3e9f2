// Dense matrix multiply, row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// op(X) is X or X^T. lda/ldb/ldc are row strides of the matrices as stored.
// This is the only GEMM entry point of the model code; the backend (cpu/ now, cuda/ later) is
// chosen at build time behind this declaration.
#pragma once

#include <cstdint>

namespace moecore::kernels {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace moecore::kernels
