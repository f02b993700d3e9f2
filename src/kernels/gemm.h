// Dense matrix multiply, row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// op(X) is X or X^T. lda/ldb/ldc are row strides of the matrices as stored.
// This is the only GEMM entry point of the model code; the backend (cpu/ now, cuda/ later) is
// chosen at build time behind this declaration.
#pragma once

#include <cstdint>

#include "kernels/matmul_precision.h"

namespace moecore::kernels {

// In `precision`: fp32 (gemm_fp32), or bf16 operands with fp32 accumulation (gemm_bf16 on
// bf16_gemm_path()).
void gemm(MatmulPrecision precision, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc);

// Always fp32.
void gemm_fp32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

// How a bf16 GEMM runs. kNative: bf16 operands into oneDNN's matmul (AVX512-BF16 or AMX kernels,
// fp32 accumulation). kEmulated: operands rounded to bf16 but kept as fp32 and multiplied by the
// fp32 sgemm; a product of two bf16 values is exact in fp32, so both paths compute the same sums
// and differ only in summation order. The emulated path serves CPUs without native bf16.
enum class Bf16GemmPath { kNative, kEmulated };

// The path gemm() takes for kBf16 on this CPU: kNative when oneDNN may dispatch to avx512_core_bf16
// or better (DNNL_MAX_CPU_ISA can lower that), else kEmulated.
Bf16GemmPath bf16_gemm_path();

// Whether a native bf16 GEMM of this shape runs its first rows through a fixed-shape oneDNN
// primitive on AMX kernels (kernels/cpu/gemm_bf16.cpp: where oneDNN has AMX, for row-major A, K
// and B small enough, N a multiple of 64 and a dense C); the rest of its rows, and every other
// GEMM, go through the runtime-M primitive. For tests and benchmarks.
bool bf16_gemm_runs_fixed_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, float beta, int64_t ldc);

// Whether GEMMs in `precision` multiply bf16 bits on this CPU (bf16 on the native path), so that
// an operand rounded to bf16 once can be read by several of them as it is. The emulated path
// multiplies fp32 values: it would widen such a rounding again in every GEMM.
bool gemms_read_bf16_bits(MatmulPrecision precision);

// A bf16 GEMM on an explicit path (tests compare both).
void gemm_bf16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
               float* c, int64_t ldc);

// A bf16 GEMM whose B operand is bf16 already (a weight copy made once per optimizer step, so
// that only A is converted here): b16 holds bf16 bits, contiguous in its stored layout ([K, N],
// or [N, K] when trans_b). The sums are those of gemm_bf16 on the fp32 values b16 rounds from.
void gemm_bf16_b16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const uint16_t* b16, float beta,
                   float* c, int64_t ldc);

// A bf16 GEMM whose A operand is bf16 already (an activation rounded once for several GEMMs): a16
// holds bf16 bits, contiguous in its stored layout ([M, K], or [K, M] when trans_a); B is fp32,
// rounded here. The sums are those of gemm_bf16 on the fp32 values a16 rounds from.
void gemm_bf16_a16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const uint16_t* a16, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc);

// A bf16 GEMM whose operands are both bf16 already (each converted once for several GEMMs, e.g.
// flash attention's q, k and v for every key block): a16 and b16 hold bf16 bits, each contiguous
// in its stored layout. The sums are those of gemm_bf16 on the fp32 values they round from.
void gemm_bf16_ab16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const uint16_t* a16, const uint16_t* b16, float beta, float* c,
                    int64_t ldc);

}  // namespace moecore::kernels
