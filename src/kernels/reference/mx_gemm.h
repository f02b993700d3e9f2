// The MX GEMM as plain scalar loops: the oracle the optimised kernels (cpu/mx_gemm.h) must match
// bit for bit.
//
// C[M,N] = A[M,K] . B[N,K]^T, both operands MX-quantised along K (OCP MX v1.0): codes [rows, K]
// contiguous, E8M0 scales [rows, K / 32]. For each output, in this fixed order:
//   acc = 0; for each block b (ascending): s = 0; for k in b (ascending): s += a_k * b_k;
//                                          acc += s * Xa_b * Xb_b
// all in fp32. The products of two FP8 elements are exact in fp32 (at most 4 x 4 significant
// bits), so only the additions round, and a fused multiply-add would give the same bits. The block
// sum is scaled by 2^(ea + eb - 254) in one exactly rounded step (std::ldexp: exact unless the
// result leaves fp32's normal range); a NaN scale (code 255) on either side makes the block's
// contribution NaN.
#pragma once

#include <cstdint>

#include "core/mx_types.h"

namespace moecore::kernels {

namespace reference {

// C (row stride ldc) = A . B^T; K must be a positive multiple of 32 (else a one-line error).
void mx_gemm(int64_t m, int64_t n, int64_t k, const mx::MxOperand& a, const mx::MxOperand& b,
             float* c, int64_t ldc);

}  // namespace reference
}  // namespace moecore::kernels
