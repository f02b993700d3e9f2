#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/grouped_gemm_device.h"

namespace moecore::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileRows = 64;  // rows of x (and y) per block
constexpr int kTileCols = 64;  // outputs (rows of w) per block
constexpr int kTileK = 32;     // contraction per step
constexpr int kThreads = 128;  // four warps, each a 32 x 32 quarter of the tile: 2 x 2 fragments
// Row padding of the shared tiles: keeps the fragments' 32-byte alignment (WMMA needs it) and
// moves consecutive rows to other banks.
constexpr int kPadK = kTileK + 8;        // bf16 elements (80 bytes a row)
constexpr int kPadCols = kTileCols + 4;  // floats (272 bytes a row)

struct TileOperands {
  __nv_bfloat16 a[kTileRows][kPadK];  // x's rows, k contiguous
  __nv_bfloat16 b[kTileCols][kPadK];  // w's rows (outputs), k contiguous: B = w^T column-major
};
union SharedTiles {
  TileOperands operands;
  float c[kTileRows][kPadCols];  // the accumulators on their way out
};

// The expert and the first row of this block's tile, from the offsets; false past the last tile.
__device__ bool find_tile(const int64_t* offsets, int64_t experts, int64_t tile, int64_t* expert,
                          int64_t* first_row, int64_t* end_row) {
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], end = offsets[e + 1];
    const int64_t tiles = (end - begin + kTileRows - 1) / kTileRows;
    if (tile < tiles) {
      *expert = e;
      *first_row = begin + tile * kTileRows;
      *end_row = end;
      return true;
    }
    tile -= tiles;
  }
  return false;
}

__global__ void __launch_bounds__(kThreads)
    grouped_gemm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, const int64_t* offsets,
                        int64_t experts, int64_t out, int64_t in, float* y) {
  __shared__ __align__(32) SharedTiles shared;
  int64_t expert = 0, first_row = 0, end_row = 0;
  // The same answer in every thread: the block returns as a whole.
  if (!find_tile(offsets, experts, blockIdx.x, &expert, &first_row, &end_row)) return;
  const int64_t first_col = int64_t{blockIdx.y} * kTileCols;
  const __nv_bfloat16* we = w + expert * out * in;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);

  for (int64_t k0 = 0; k0 < in; k0 += kTileK) {
    // Both tiles, zero past the expert's rows, the outputs and the contraction.
    for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileK; i += kThreads) {
      const int r = i / kTileK, kk = i % kTileK;
      const int64_t row = first_row + r, k = k0 + kk;
      shared.operands.a[r][kk] = row < end_row && k < in ? x[row * in + k] : zero;
    }
    for (int i = static_cast<int>(threadIdx.x); i < kTileCols * kTileK; i += kThreads) {
      const int n = i / kTileK, kk = i % kTileK;
      const int64_t col = first_col + n, k = k0 + kk;
      shared.operands.b[n][kk] = col < out && k < in ? we[col * in + k] : zero;
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(a[i], &shared.operands.a[warp_row + 16 * i][kk], kPadK);
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(b[j], &shared.operands.b[warp_col + 16 * j][kk], kPadK);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // the next step's loads overwrite the tiles
  }

  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&shared.c[warp_row + 16 * i][warp_col + 16 * j], acc[i][j], kPadCols,
                              wmma::mem_row_major);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileCols; i += kThreads) {
    const int r = i / kTileCols, n = i % kTileCols;
    const int64_t row = first_row + r, col = first_col + n;
    if (row < end_row && col < out) y[row * out + col] = shared.c[r][n];
  }
}

}  // namespace

void launch_grouped_gemm_bf16_device_offsets(const uint16_t* x, const uint16_t* w,
                                             const int64_t* offsets, int64_t experts,
                                             int64_t rows_capacity, int64_t out, int64_t in,
                                             float* y, cudaStream_t stream) {
  if (experts <= 0 || rows_capacity <= 0 || out <= 0) return;
  // Every expert's last tile may be partial: at most one tile more per expert than the rows need.
  const int64_t tiles = (rows_capacity + kTileRows - 1) / kTileRows + experts;
  const dim3 grid(static_cast<unsigned int>(tiles),
                  static_cast<unsigned int>((out + kTileCols - 1) / kTileCols));
  grouped_gemm_kernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(x),
                                                     reinterpret_cast<const __nv_bfloat16*>(w),
                                                     offsets, experts, out, in, y);
}

}  // namespace moecore::kernels::cuda
