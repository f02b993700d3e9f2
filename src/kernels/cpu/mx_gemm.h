// The MX GEMM on the CPU: C[M,N] = A[M,K] . B[N,K]^T with both operands MX-quantised along K
// (mx::quantize), bit-identical to the scalar reference (kernels/reference/mx_gemm.h, which states
// the summation order) for every shape, thread count and instruction set.
//
// Exact rather than merely close: the FP8 products are exact in fp32 and each output keeps the
// reference's order (k ascending inside a block, blocks ascending). The speed comes from running
// 4 rows x 64 columns of outputs side by side in SIMD lanes (16 columns at a time on CPUs with AVX2
// but not AVX-512: half the vector registers), each lane summing in that order, over operands
// decoded once per call to fp32 (B transposed into panels of 64 columns).
#pragma once

#include <cstdint>

#include "core/mx_types.h"

namespace moecore::kernels::cpu {

// Which inner kernel runs: the one for this CPU (the AVX2 kernel where it has AVX2 and FMA but not
// AVX-512, else the generic kernel's SIMD clone for it), or one named, so that the tests check
// every kernel a CPU can run, whichever the CPU picks.
enum class MxGemmKernel : uint8_t { kForThisCpu, kGeneric, kAvx2 };

// Whether this CPU (and this build: x86-64, GCC or Clang) can run `kernel`.
bool mx_gemm_kernel_available(MxGemmKernel kernel);

// C (row stride ldc) = A . B^T; K must be a positive multiple of 32 (else a one-line error), and
// `kernel` one this CPU can run.
void mx_gemm(int64_t m, int64_t n, int64_t k, const mx::MxOperand& a, const mx::MxOperand& b,
             float* c, int64_t ldc, MxGemmKernel kernel = MxGemmKernel::kForThisCpu);

}  // namespace moecore::kernels::cpu
