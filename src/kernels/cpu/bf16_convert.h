// Bulk fp32 -> bf16 operand conversion for the bf16 GEMMs: a strided matrix in, a contiguous one
// out, rounding as float_to_bf16 (core/bf16.h) does, element for element.
#pragma once

#include <cstdint>

namespace moecore::kernels::cpu {

// src: [rows, cols] with row stride ld. dst: [rows, cols] contiguous. Runs on the OpenMP pool when
// called outside a parallel region and big enough.
void convert_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst);

// The same values kept as fp32 (each exactly representable in bf16): the operands of the emulated
// bf16 GEMM.
void round_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst);

// bf16 bits back to fp32 (exact): src, dst [n] contiguous.
void widen_bf16(const uint16_t* src, int64_t n, float* dst);

}  // namespace moecore::kernels::cpu
