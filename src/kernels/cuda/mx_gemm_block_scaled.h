// One MX GEMM on Blackwell's MX tensor cores: cuBLASLt's block-scaled FP8 matmul on the codes and
// scales as they are (mx_gemm_block_scaled.cpp). c [m, n] = alpha a b^T + beta c for a [m, k] and
// b [n, k], MX operands quantised along k (a positive multiple of 32), c f32 row-major; beta = 0
// does not read c. Issued on runtime.h's stream. Returns false, having issued nothing, where
// cuBLASLt has no block-scaled kernel for this GEMM (device, element types, extents, alignment):
// the caller then takes the bf16 path (mx_gemm.cpp). op names the operation in its errors.
#pragma once

#include <cstdint>

#include "core/mx_types.h"

namespace moecore::kernels::cuda {

bool mx_gemm_block_scaled(const char* op, const mx::MxOperand& a, const mx::MxOperand& b, int64_t m,
                          int64_t n, int64_t k, float alpha, float beta, float* c);

}  // namespace moecore::kernels::cuda
