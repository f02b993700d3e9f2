#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/grouped_gemm_device.h"

namespace moecore::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileRows = 128;  // rows of the output per block
constexpr int kTileCols = 128;  // columns of the output per block
constexpr int kTileK = 32;      // contraction per step
constexpr int kWarps = 8;       // 2 x 4 warps, each a 64 x 32 part of the tile: 4 x 2 fragments
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kFragRows = kWarpRows / 16, kFragCols = kWarpCols / 16;
constexpr int kVec = 8;  // bf16 values per 16-byte load

// The shared operand tiles, in either of two layouts, each row padded by 8 bf16 (16 bytes: rows
// stay 16-byte aligned for the vector stores, every 16th row 32-byte aligned for WMMA, and
// consecutive rows fall on other banks):
//   k-contiguous [128][kTileK + 8]: A row-major (the output's rows) or B col-major (its columns);
//   k-strided    [kTileK][128 + 8]: A col-major or B row-major.
constexpr int kLdKContiguous = kTileK + kVec;
constexpr int kLdKStrided = kTileRows + kVec;
constexpr int kTileElements = kTileRows * kLdKContiguous > kTileK* kLdKStrided
                                  ? kTileRows* kLdKContiguous
                                  : kTileK* kLdKStrided;
// Each warp's 16 x 16 fragment on its way out, 80-byte rows.
constexpr int kScratchLd = 20;

struct SharedTiles {
  __nv_bfloat16 a[kTileElements];
  __nv_bfloat16 b[kTileElements];
  float scratch[kWarps][16 * kScratchLd];
};

// Eight bf16 values, loaded and stored as one 16-byte access where the operand allows it.
union Vec {
  uint4 bits;
  __nv_bfloat16 values[kVec];
};

// A kRows x kCols block of a row-major bf16 matrix, from global memory through registers into a
// shared tile: element (r, c) is src[r * ld + c], zero at r >= valid_rows or c >= valid_cols.
// Loaded before the previous step's products so that the loads overlap them. kVector: 16-byte
// loads (ld, the columns and src 16-byte aligned: the launch checks), else one value at a time.
template <int kRows, int kCols, bool kVector>
struct BlockLoad {
  static constexpr int kVecsPerRow = kCols / kVec;
  static constexpr int kPerThread = kRows * kVecsPerRow / kThreads;
  static_assert(kCols % kVec == 0 && kRows * kVecsPerRow % kThreads == 0);
  Vec regs[kPerThread];

  __device__ void load(const __nv_bfloat16* src, int64_t ld, int64_t valid_rows,
                       int64_t valid_cols) {
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int v = static_cast<int>(threadIdx.x) + i * kThreads;
      const int r = v / kVecsPerRow, c = (v % kVecsPerRow) * kVec;
      if (kVector) {
        if (r < valid_rows && c < valid_cols) {
          regs[i].bits = *reinterpret_cast<const uint4*>(src + r * ld + c);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) regs[i].values[j] = zero;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          regs[i].values[j] = r < valid_rows && c + j < valid_cols ? src[r * ld + c + j] : zero;
      }
    }
  }

  // Into a shared tile of ld_s elements a row.
  __device__ void store(__nv_bfloat16* dst, int ld_s) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int v = static_cast<int>(threadIdx.x) + i * kThreads;
      const int r = v / kVecsPerRow, c = (v % kVecsPerRow) * kVec;
      *reinterpret_cast<uint4*>(dst + r * ld_s + c) = regs[i].bits;
    }
  }
};

// This warp's 64 x 32 part of the block's tile (eight warps, 2 x 4).
struct WarpTile {
  __device__ WarpTile()
      : row((static_cast<int>(threadIdx.x) / 32 / 4) * kWarpRows),
        col((static_cast<int>(threadIdx.x) / 32 % 4) * kWarpCols) {}
  int row, col;
};

using Accumulators = wmma::fragment<wmma::accumulator, 16, 16, 16, float>[kFragRows][kFragCols];

__device__ void clear(Accumulators& acc) {
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
}

// The step's products into the warp's fragments, from A and B in shared memory in the layouts the
// fragment types name; fragments wholly outside [valid_rows, valid_cols) of the tile are skipped
// (the same in every lane of the warp).
template <typename LayoutA, typename LayoutB>
__device__ void multiply_step(const SharedTiles& shared, const WarpTile& warp, Accumulators& acc,
                              int64_t valid_rows, int64_t valid_cols) {
  constexpr bool kARowMajor = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool kBColMajor = std::is_same_v<LayoutB, wmma::col_major>;
  for (int kk = 0; kk < kTileK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> a[kFragRows];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> b[kFragCols];
    for (int i = 0; i < kFragRows; ++i) {
      const int m = warp.row + 16 * i;
      if (m >= valid_rows) break;
      wmma::load_matrix_sync(
          a[i], kARowMajor ? &shared.a[m * kLdKContiguous + kk] : &shared.a[kk * kLdKStrided + m],
          kARowMajor ? kLdKContiguous : kLdKStrided);
    }
    for (int j = 0; j < kFragCols; ++j) {
      const int n = warp.col + 16 * j;
      if (n >= valid_cols) break;
      wmma::load_matrix_sync(
          b[j], kBColMajor ? &shared.b[n * kLdKContiguous + kk] : &shared.b[kk * kLdKStrided + n],
          kBColMajor ? kLdKContiguous : kLdKStrided);
    }
    for (int i = 0; i < kFragRows; ++i)
      for (int j = 0; j < kFragCols; ++j)
        if (warp.row + 16 * i < valid_rows && warp.col + 16 * j < valid_cols)
          wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
  }
}

// out[r, c] (= or +=, kAdd) the warp's fragments for r < valid_rows, c < valid_cols of the tile
// at out (ld floats a row), one fragment at a time through the warp's scratch.
template <bool kAdd>
__device__ void write_out(SharedTiles& shared, const WarpTile& warp, const Accumulators& acc,
                          float* out, int64_t ld, int64_t valid_rows, int64_t valid_cols) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  float* scratch = shared.scratch[threadIdx.x / 32];
  for (int i = 0; i < kFragRows; ++i)
    for (int j = 0; j < kFragCols; ++j) {
      const int m0 = warp.row + 16 * i, n0 = warp.col + 16 * j;
      if (m0 >= valid_rows || n0 >= valid_cols) continue;  // the same in every lane
      wmma::store_matrix_sync(scratch, acc[i][j], kScratchLd, wmma::mem_row_major);
      __syncwarp();
      // Lane pairs write a row's 16 values, 8 each: 64-byte runs of consecutive addresses.
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        const int64_t m = m0 + r, n = n0 + c;
        if (m < valid_rows && n < valid_cols) {
          float& dst = out[m * ld + n];
          dst = kAdd ? dst + scratch[r * kScratchLd + c] : scratch[r * kScratchLd + c];
        }
      }
      __syncwarp();  // the scratch is read before the next fragment overwrites it
    }
}

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

// y[rows of e] (=) a[rows of e] . op(w[e]), contracting over k: a [rows, k]; w[e] holds `cols`
// x `k` values ([cols, k] row-major, op = transpose: the forward) or `k` x `cols` ([k, cols],
// op = identity: the input gradient, kWeightKMajor). One block per (row tile of an expert,
// column tile).
template <bool kWeightKMajor, bool kVector>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const __nv_bfloat16* a, const __nv_bfloat16* w, const int64_t* offsets,
                int64_t experts, int64_t cols, int64_t k, float* y) {
  __shared__ __align__(128) SharedTiles shared;
  int64_t expert = 0, first_row = 0, end_row = 0;
  // The same answer in every thread: the block returns as a whole.
  if (!find_tile(offsets, experts, blockIdx.x, &expert, &first_row, &end_row)) return;
  const int64_t first_col = int64_t{blockIdx.y} * kTileCols;
  const int64_t valid_rows = end_row - first_row, valid_cols = cols - first_col;
  const __nv_bfloat16* a_rows = a + first_row * k;
  const __nv_bfloat16* we = w + expert * cols * k;
  const WarpTile warp;
  Accumulators acc;
  clear(acc);

  // A: the rows' k values. B: the columns' k values ([cols, k]) or k rows of the columns.
  BlockLoad<kTileRows, kTileK, kVector> a_load;
  using BLoad = std::conditional_t<kWeightKMajor, BlockLoad<kTileK, kTileCols, kVector>,
                                   BlockLoad<kTileCols, kTileK, kVector>>;
  BLoad b_load;
  const auto load_step = [&](int64_t k0) {
    a_load.load(a_rows + k0, k, valid_rows, k - k0);
    if (kWeightKMajor) {
      b_load.load(we + k0 * cols + first_col, cols, k - k0, valid_cols);
    } else {
      b_load.load(we + first_col * k + k0, k, valid_cols, k - k0);
    }
  };
  load_step(0);
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    a_load.store(shared.a, kLdKContiguous);
    b_load.store(shared.b, kWeightKMajor ? kLdKStrided : kLdKContiguous);
    __syncthreads();
    if (k0 + kTileK < k) load_step(k0 + kTileK);  // in flight during the products
    using LayoutB = std::conditional_t<kWeightKMajor, wmma::row_major, wmma::col_major>;
    multiply_step<wmma::row_major, LayoutB>(shared, warp, acc, valid_rows, valid_cols);
    __syncthreads();  // the next step's stores overwrite the tiles
  }
  write_out<false>(shared, warp, acc, y + first_row * cols + first_col, cols, valid_rows,
                   valid_cols);
}

// dw[e] (+=) dy[rows of e]^T . x[rows of e], contracting over the expert's rows: dy [rows, out],
// x [rows, in], dw [experts, out, in] fp32. One block per (expert, out tile, in tile); an expert
// without rows adds nothing.
template <bool kVector>
__global__ void __launch_bounds__(kThreads)
    weight_grad_kernel(const __nv_bfloat16* dy, const __nv_bfloat16* x, const int64_t* offsets,
                       int64_t out, int64_t in, int64_t out_tiles, int64_t in_tiles, float* dw) {
  __shared__ __align__(128) SharedTiles shared;
  const int64_t tiles = out_tiles * in_tiles;
  const int64_t expert = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const int64_t first_m = (tile / in_tiles) * kTileRows, first_n = (tile % in_tiles) * kTileCols;
  const int64_t begin = offsets[expert], end = offsets[expert + 1];
  if (end <= begin) return;
  const int64_t valid_rows = out - first_m, valid_cols = in - first_n;
  const WarpTile warp;
  Accumulators acc;
  clear(acc);

  // A = dy^T, B = x: both k-strided (kTileK of the expert's rows, each a run of the tile's
  // output or input values).
  BlockLoad<kTileK, kTileRows, kVector> a_load;
  BlockLoad<kTileK, kTileCols, kVector> b_load;
  const auto load_step = [&](int64_t r0) {
    a_load.load(dy + r0 * out + first_m, out, end - r0, valid_rows);
    b_load.load(x + r0 * in + first_n, in, end - r0, valid_cols);
  };
  load_step(begin);
  for (int64_t r0 = begin; r0 < end; r0 += kTileK) {
    a_load.store(shared.a, kLdKStrided);
    b_load.store(shared.b, kLdKStrided);
    __syncthreads();
    if (r0 + kTileK < end) load_step(r0 + kTileK);
    multiply_step<wmma::col_major, wmma::row_major>(shared, warp, acc, valid_rows, valid_cols);
    __syncthreads();
  }
  write_out<true>(shared, warp, acc, dw + expert * out * in + first_m * in + first_n, in,
                  valid_rows, valid_cols);
}

// Every expert's last row tile may be partial: at most one tile more per expert than the rows
// need.
dim3 row_tile_grid(int64_t experts, int64_t rows_capacity, int64_t cols) {
  const int64_t tiles = (rows_capacity + kTileRows - 1) / kTileRows + experts;
  return {static_cast<unsigned int>(tiles),
          static_cast<unsigned int>((cols + kTileCols - 1) / kTileCols)};
}

// 16-byte loads need 16-byte aligned operands and rows of a multiple of 8 values.
bool vector_loads(const void* p, const void* q, int64_t out, int64_t in) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
         out % kVec == 0 && in % kVec == 0;
}

template <bool kWeightKMajor>
void launch_rows(const uint16_t* a, const uint16_t* w, const int64_t* offsets, int64_t experts,
                 int64_t rows_capacity, int64_t cols, int64_t k, bool vector, float* y,
                 cudaStream_t stream) {
  const auto* ab = reinterpret_cast<const __nv_bfloat16*>(a);
  const auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
  const dim3 grid = row_tile_grid(experts, rows_capacity, cols);
  if (vector) {
    rows_kernel<kWeightKMajor, true>
        <<<grid, kThreads, 0, stream>>>(ab, wb, offsets, experts, cols, k, y);
  } else {
    rows_kernel<kWeightKMajor, false>
        <<<grid, kThreads, 0, stream>>>(ab, wb, offsets, experts, cols, k, y);
  }
}

}  // namespace

void launch_grouped_gemm_bf16_device_offsets(const uint16_t* x, const uint16_t* w,
                                             const int64_t* offsets, int64_t experts,
                                             int64_t rows_capacity, int64_t out, int64_t in,
                                             float* y, cudaStream_t stream) {
  if (experts <= 0 || rows_capacity <= 0 || out <= 0) return;
  launch_rows<false>(x, w, offsets, experts, rows_capacity, out, in, vector_loads(x, w, out, in), y,
                     stream);
}

void launch_grouped_gemm_bf16_device_offsets_input_grad(const uint16_t* dy, const uint16_t* w,
                                                        const int64_t* offsets, int64_t experts,
                                                        int64_t rows_capacity, int64_t out,
                                                        int64_t in, float* dx,
                                                        cudaStream_t stream) {
  if (experts <= 0 || rows_capacity <= 0 || in <= 0) return;
  launch_rows<true>(dy, w, offsets, experts, rows_capacity, in, out, vector_loads(dy, w, out, in),
                    dx, stream);
}

void launch_grouped_gemm_bf16_device_offsets_weight_grad(const uint16_t* dy, const uint16_t* x,
                                                         const int64_t* offsets, int64_t experts,
                                                         int64_t out, int64_t in, float* dw,
                                                         cudaStream_t stream) {
  if (experts <= 0 || out <= 0 || in <= 0) return;
  const int64_t out_tiles = (out + kTileRows - 1) / kTileRows;
  const int64_t in_tiles = (in + kTileCols - 1) / kTileCols;
  const auto grid = static_cast<unsigned int>(experts * out_tiles * in_tiles);
  const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  if (vector_loads(dy, x, out, in)) {
    weight_grad_kernel<true>
        <<<grid, kThreads, 0, stream>>>(dyb, xb, offsets, out, in, out_tiles, in_tiles, dw);
  } else {
    weight_grad_kernel<false>
        <<<grid, kThreads, 0, stream>>>(dyb, xb, offsets, out, in, out_tiles, in_tiles, dw);
  }
}

}  // namespace moecore::kernels::cuda
