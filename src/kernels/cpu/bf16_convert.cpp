#include "kernels/cpu/bf16_convert.h"

#include <omp.h>

#include <algorithm>

#include "core/bf16.h"
#include "core/simd.h"

namespace moecore::kernels::cpu {

namespace {

// Below this many elements a conversion is not worth waking the pool for.
constexpr int64_t kParallelElements = int64_t{1} << 15;

bool run_parallel(int64_t rows, int64_t cols) {
  return rows > 1 && rows * cols >= kParallelElements && omp_in_parallel() == 0;
}

// The row loops are cloned for AVX-512 and AVX2 (core/simd.h); every clone rounds identically.
MOECORE_SIMD_CLONES void row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = float_to_bf16(src[j]);
}

MOECORE_SIMD_CLONES void row_round(const float* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = moecore::round_to_bf16(src[j]);
}

MOECORE_SIMD_CLONES void row_widen(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = bf16_to_float(src[j]);
}

}  // namespace

void convert_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst) {
#pragma omp parallel for schedule(static) if (run_parallel(rows, cols))
  for (int64_t i = 0; i < rows; ++i) row_to_bf16(src + i * ld, dst + i * cols, cols);
}

void round_to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
#pragma omp parallel for schedule(static) if (run_parallel(rows, cols))
  for (int64_t i = 0; i < rows; ++i) row_round(src + i * ld, dst + i * cols, cols);
}

void widen_bf16(const uint16_t* src, int64_t n, float* dst) {
  // In rows of a fixed length so that the pool splits a long vector.
  constexpr int64_t kRow = 4096;
  const int64_t rows = (n + kRow - 1) / kRow;
#pragma omp parallel for schedule(static) if (run_parallel(rows, kRow))
  for (int64_t i = 0; i < rows; ++i)
    row_widen(src + i * kRow, dst + i * kRow, std::min(kRow, n - i * kRow));
}

}  // namespace moecore::kernels::cpu
