#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/grouped_gemm_device.h"

namespace moecore::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileRows = 64;  // rows of the output per block
constexpr int kTileCols = 64;  // columns of the output per block
constexpr int kTileK = 32;     // contraction per step
constexpr int kThreads = 128;  // four warps, each a 32 x 32 quarter of the tile: 2 x 2 fragments
// Row padding of the shared tiles: keeps the fragments' 32-byte alignment (WMMA needs it) and
// moves consecutive rows to other banks.
constexpr int kPadK = kTileK + 8;        // bf16 elements (80 bytes a row)
constexpr int kPadCols = kTileCols + 4;  // floats (272 bytes a row)

struct TileOperands {
  __nv_bfloat16 a[kTileRows][kPadK];  // the output's rows, k contiguous
  __nv_bfloat16 b[kTileCols][kPadK];  // the output's columns, k contiguous: B column-major
};
union SharedTiles {
  TileOperands operands;
  float c[kTileRows][kPadCols];  // the accumulators on their way out
};

// The expert and the first row of this block's row tile, from the offsets; false past the last
// tile.
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

// This warp's 32 x 32 quarter of the block's tile (four warps, 2 x 2).
struct WarpTile {
  __device__ WarpTile()
      : row((static_cast<int>(threadIdx.x) / 32 / 2) * 32),
        col((static_cast<int>(threadIdx.x) / 32 % 2) * 32) {}
  int row, col;
};

// The warp's 2 x 2 fragments of fp32 accumulators.
using Accumulators = wmma::fragment<wmma::accumulator, 16, 16, 16, float>[2][2];

__device__ void clear(Accumulators& acc) {
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
}

// The tile's product from the shared operands of one k step into the warp's 2 x 2 fragments.
__device__ void multiply_step(const SharedTiles& shared, const WarpTile& warp, Accumulators& acc) {
  const int warp_row = warp.row, warp_col = warp.col;
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
}

// The accumulators through shared memory (the operands' space, no longer read).
__device__ void stage_accumulators(SharedTiles& shared, const WarpTile& warp,
                                   const Accumulators& acc) {
  const int warp_row = warp.row, warp_col = warp.col;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&shared.c[warp_row + 16 * i][warp_col + 16 * j], acc[i][j], kPadCols,
                              wmma::mem_row_major);
}

// y[rows of e] (=) a[rows of e] . op(w[e]), contracting over k: a [rows, k]; w[e] holds `cols`
// x `k` values ([cols, k] row-major, op = transpose: the forward) or `k` x `cols` ([k, cols],
// op = identity: the input gradient, kWeightKMajor). One block per (row tile of an expert,
// column tile).
template <bool kWeightKMajor>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const __nv_bfloat16* a, const __nv_bfloat16* w, const int64_t* offsets,
                int64_t experts, int64_t cols, int64_t k, float* y) {
  __shared__ __align__(32) SharedTiles shared;
  int64_t expert = 0, first_row = 0, end_row = 0;
  // The same answer in every thread: the block returns as a whole.
  if (!find_tile(offsets, experts, blockIdx.x, &expert, &first_row, &end_row)) return;
  const int64_t first_col = int64_t{blockIdx.y} * kTileCols;
  const __nv_bfloat16* we = w + expert * cols * k;
  const WarpTile warp;
  Accumulators acc;
  clear(acc);
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);

  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    // Both tiles, zero past the expert's rows, the columns and the contraction.
    for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileK; i += kThreads) {
      const int r = i / kTileK, kk = i % kTileK;
      const int64_t row = first_row + r, kx = k0 + kk;
      shared.operands.a[r][kk] = row < end_row && kx < k ? a[row * k + kx] : zero;
    }
    for (int i = static_cast<int>(threadIdx.x); i < kTileCols * kTileK; i += kThreads) {
      // Consecutive threads read consecutive addresses of w in either layout.
      const int n = kWeightKMajor ? i % kTileCols : i / kTileK;
      const int kk = kWeightKMajor ? i / kTileCols : i % kTileK;
      const int64_t col = first_col + n, kx = k0 + kk;
      const bool inside = col < cols && kx < k;
      shared.operands.b[n][kk] =
          inside ? (kWeightKMajor ? we[kx * cols + col] : we[col * k + kx]) : zero;
    }
    __syncthreads();
    multiply_step(shared, warp, acc);
    __syncthreads();  // the next step's loads overwrite the tiles
  }

  stage_accumulators(shared, warp, acc);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileCols; i += kThreads) {
    const int r = i / kTileCols, n = i % kTileCols;
    const int64_t row = first_row + r, col = first_col + n;
    if (row < end_row && col < cols) y[row * cols + col] = shared.c[r][n];
  }
}

// dw[e] (+=) dy[rows of e]^T . x[rows of e], contracting over the expert's rows: dy [rows, out],
// x [rows, in], dw [experts, out, in] fp32. One block per (expert, out tile, in tile); an expert
// without rows adds nothing.
__global__ void __launch_bounds__(kThreads)
    weight_grad_kernel(const __nv_bfloat16* dy, const __nv_bfloat16* x, const int64_t* offsets,
                       int64_t out, int64_t in, int64_t out_tiles, int64_t in_tiles, float* dw) {
  __shared__ __align__(32) SharedTiles shared;
  const int64_t tiles = out_tiles * in_tiles;
  const int64_t expert = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const int64_t first_m = (tile / in_tiles) * kTileRows, first_n = (tile % in_tiles) * kTileCols;
  const int64_t begin = offsets[expert], end = offsets[expert + 1];
  if (end <= begin) return;
  const WarpTile warp;
  Accumulators acc;
  clear(acc);
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);

  for (int64_t r0 = begin; r0 < end; r0 += kTileK) {
    // A = dy^T (an output row's values over the expert's rows), B = x: both read along their
    // rows in memory, consecutive threads at consecutive addresses.
    for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileK; i += kThreads) {
      const int m = i % kTileRows, kk = i / kTileRows;
      const int64_t row = r0 + kk, o = first_m + m;
      shared.operands.a[m][kk] = row < end && o < out ? dy[row * out + o] : zero;
    }
    for (int i = static_cast<int>(threadIdx.x); i < kTileCols * kTileK; i += kThreads) {
      const int n = i % kTileCols, kk = i / kTileCols;
      const int64_t row = r0 + kk, c = first_n + n;
      shared.operands.b[n][kk] = row < end && c < in ? x[row * in + c] : zero;
    }
    __syncthreads();
    multiply_step(shared, warp, acc);
    __syncthreads();
  }

  stage_accumulators(shared, warp, acc);
  __syncthreads();
  float* dwe = dw + expert * out * in;
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kTileCols; i += kThreads) {
    const int m = i / kTileCols, n = i % kTileCols;
    const int64_t o = first_m + m, c = first_n + n;
    if (o < out && c < in) dwe[o * in + c] += shared.c[m][n];
  }
}

// Every expert's last row tile may be partial: at most one tile more per expert than the rows
// need.
dim3 row_tile_grid(int64_t experts, int64_t rows_capacity, int64_t cols) {
  const int64_t tiles = (rows_capacity + kTileRows - 1) / kTileRows + experts;
  return {static_cast<unsigned int>(tiles),
          static_cast<unsigned int>((cols + kTileCols - 1) / kTileCols)};
}

}  // namespace

void launch_grouped_gemm_bf16_device_offsets(const uint16_t* x, const uint16_t* w,
                                             const int64_t* offsets, int64_t experts,
                                             int64_t rows_capacity, int64_t out, int64_t in,
                                             float* y, cudaStream_t stream) {
  if (experts <= 0 || rows_capacity <= 0 || out <= 0) return;
  rows_kernel<false><<<row_tile_grid(experts, rows_capacity, out), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), reinterpret_cast<const __nv_bfloat16*>(w), offsets,
      experts, out, in, y);
}

void launch_grouped_gemm_bf16_device_offsets_input_grad(const uint16_t* dy, const uint16_t* w,
                                                        const int64_t* offsets, int64_t experts,
                                                        int64_t rows_capacity, int64_t out,
                                                        int64_t in, float* dx,
                                                        cudaStream_t stream) {
  if (experts <= 0 || rows_capacity <= 0 || in <= 0) return;
  rows_kernel<true><<<row_tile_grid(experts, rows_capacity, in), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(dy), reinterpret_cast<const __nv_bfloat16*>(w),
      offsets, experts, in, out, dx);
}

void launch_grouped_gemm_bf16_device_offsets_weight_grad(const uint16_t* dy, const uint16_t* x,
                                                         const int64_t* offsets, int64_t experts,
                                                         int64_t out, int64_t in, float* dw,
                                                         cudaStream_t stream) {
  if (experts <= 0 || out <= 0 || in <= 0) return;
  const int64_t out_tiles = (out + kTileRows - 1) / kTileRows;
  const int64_t in_tiles = (in + kTileCols - 1) / kTileCols;
  weight_grad_kernel<<<static_cast<unsigned int>(experts * out_tiles * in_tiles), kThreads, 0,
                       stream>>>(reinterpret_cast<const __nv_bfloat16*>(dy),
                                 reinterpret_cast<const __nv_bfloat16*>(x), offsets, out, in,
                                 out_tiles, in_tiles, dw);
}

}  // namespace moecore::kernels::cuda
