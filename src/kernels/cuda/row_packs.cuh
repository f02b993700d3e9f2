// Copying and summing whole rows of floats (*.cu only): four floats at a time (16-byte accesses)
// when every row starts 16-byte aligned, one otherwise.
#pragma once

#include <cstdint>

namespace moecore::kernels::cuda {

template <int kWidth>
struct alignas(sizeof(float) * kWidth) Pack {
  float v[kWidth];
};

// A block's threads for a row of `packs` packs: a warp at least, one thread per pack up to 256
// (a multiple of 32, as block_reduce needs).
inline unsigned int pack_threads(int64_t packs) {
  const int64_t warps = (packs + 31) / 32;
  return static_cast<unsigned int>(32 * (warps < 1 ? 1 : (warps > 8 ? 8 : warps)));
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A row number read from device memory names a row of a tensor with `rows` rows. The operations
// queue a check of their row numbers (index_checks.h: an error at the next synchronisation); the
// kernels leave an out-of-range row alone rather than touching other memory.
__device__ inline bool row_inside(int32_t row, int64_t rows) {
  return row >= 0 && row < rows;
}

}  // namespace moecore::kernels::cuda
