// Launch shapes shared by the CUDA backend's kernels (*.cu only).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moecore::kernels::cuda {

// Elementwise kernels: kElementThreads per block and enough blocks to fill the device several
// times over; a grid-stride loop covers the rest.
inline constexpr int kElementThreads = 256;
inline unsigned int elementwise_blocks(int64_t n) {
  const int64_t wanted = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned int>(wanted < 65536 ? (wanted > 0 ? wanted : 1) : 65536);
}

// Row kernels: a block per row, up to kMaxRowBlocks blocks; more rows loop within the blocks.
inline constexpr int64_t kMaxRowBlocks = 65536;
inline unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
}

// Opts `kernel` into `dynamic_bytes` of dynamic shared memory where its block needs more than the
// 48 KiB every block may have (its static_bytes included): a host call, not a stream operation,
// so allowed while a graph captures, and made only then. False when refused; the error stays for
// the caller's cudaGetLastError check.
template <typename Kernel>
bool allow_dynamic_shared(Kernel* kernel, size_t dynamic_bytes, size_t static_bytes = 0) {
  constexpr size_t kDefaultSharedBytes = 48 * 1024;
  return dynamic_bytes + static_bytes <= kDefaultSharedBytes ||
         cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(dynamic_bytes)) == cudaSuccess;
}

// Kernels whose per-thread arrays and shared tiles are sized by the head dimension at compile
// time (attention): f.template operator()<kHd>() for the first kHd of kFirst, kRest... (ascending)
// that holds head_dim, the last one for anything larger (the caller checks its limit).
template <int kFirst, int... kRest, typename F>
void with_head_dim_tile(int64_t head_dim, F&& f) {
  if constexpr (sizeof...(kRest) == 0) {
    f.template operator()<kFirst>();
  } else if (head_dim <= kFirst) {
    f.template operator()<kFirst>();
  } else {
    with_head_dim_tile<kRest...>(head_dim, f);
  }
}

// The first index and the stride of a grid-stride loop over elements.
__device__ inline int64_t grid_first() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return int64_t{gridDim.x} * blockDim.x;
}

}  // namespace moecore::kernels::cuda
