// One cuBLASLt GEMM on contiguous row-major device matrices with fp32 accumulation:
// c [m, n] = alpha op(a) op(b) + beta c, op(X) = X or X^T as stored (a: [m, k] or [k, m]; b:
// [k, n] or [n, k]), a and b of one operand type (CUDA_R_32F: true fp32, no TF32; CUDA_R_16BF),
// c fp32. beta = 0 overwrites c without reading it. Issued on runtime.h's stream; op names the
// operation it is part of in its errors (runtime.h's check_launch).
#pragma once

#include <library_types.h>

#include <cstdint>

namespace moecore::kernels::cuda {

void gemm_lt(const char* op, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const void* a, const void* b, cudaDataType_t operand_type, float beta,
             float* c);

}  // namespace moecore::kernels::cuda
