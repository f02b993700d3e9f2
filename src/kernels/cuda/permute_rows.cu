// Routed-row permutations: one block per row of the result (a grid-stride loop over rows), its
// threads over the columns, four at a time (16-byte loads) when every row starts 16-byte aligned.
// The backward adds a token's routes in route order from 0.0f, the CPU's order: no atomics, and
// the same bits as the CPU. A row number outside its tensor writes nothing and reads NaN: the
// operations queue a check of their row numbers (an error at the next synchronisation), and this
// keeps such a row out of other memory meanwhile. gather_rows's -1 (an empty slot) writes zeros.
#include <math_constants.h>

#include <cstdint>

#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/row_packs.cuh"

namespace moecore::kernels::cuda {
namespace {

template <int kWidth>
__global__ void permute_rows_kernel(const float* src, const int32_t* dst_row, int64_t routes,
                                    int64_t routes_per_row, int64_t d, float* dst,
                                    int64_t dst_rows) {
  const int64_t packs = d / kWidth;
  for (int64_t r = blockIdx.x; r < routes; r += gridDim.x) {
    const int32_t to = dst_row[r];
    if (!row_inside(to, dst_rows)) continue;
    const auto* s = reinterpret_cast<const Pack<kWidth>*>(src + (r / routes_per_row) * d);
    auto* out = reinterpret_cast<Pack<kWidth>*>(dst + int64_t{to} * d);
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) out[c] = s[c];
  }
}

template <int kWidth>
__global__ void permute_rows_backward_kernel(const float* d_dst, int64_t dst_rows,
                                             const int32_t* dst_row, int64_t tokens,
                                             int64_t routes_per_row, int64_t d, float* d_src) {
  const int64_t packs = d / kWidth;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int32_t* from = dst_row + t * routes_per_row;
    auto* out = reinterpret_cast<Pack<kWidth>*>(d_src + t * d);
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      Pack<kWidth> sum;
      for (int l = 0; l < kWidth; ++l) sum.v[l] = 0.0f;
      for (int64_t j = 0; j < routes_per_row; ++j) {
        const int32_t row = from[j];
        if (row_inside(row, dst_rows)) {
          const Pack<kWidth> g = reinterpret_cast<const Pack<kWidth>*>(d_dst + int64_t{row} * d)[c];
          for (int l = 0; l < kWidth; ++l) sum.v[l] += g.v[l];
        } else {
          for (int l = 0; l < kWidth; ++l) sum.v[l] = CUDART_NAN_F;
        }
      }
      out[c] = sum;
    }
  }
}

template <int kWidth>
__global__ void gather_rows_kernel(const float* src, int64_t src_rows, const int32_t* src_row,
                                   int64_t rows, int64_t d, float* dst) {
  const int64_t packs = d / kWidth;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int32_t from = src_row[i];
    auto* out = reinterpret_cast<Pack<kWidth>*>(dst + i * d);
    if (row_inside(from, src_rows)) {
      const auto* s = reinterpret_cast<const Pack<kWidth>*>(src + int64_t{from} * d);
      for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) out[c] = s[c];
    } else if (from == -1) {  // an empty slot
      Pack<kWidth> zero;
      for (int l = 0; l < kWidth; ++l) zero.v[l] = 0.0f;
      for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) out[c] = zero;
    } else {
      Pack<kWidth> nan;
      for (int l = 0; l < kWidth; ++l) nan.v[l] = CUDART_NAN_F;
      for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) out[c] = nan;
    }
  }
}

}  // namespace

void launch_permute_rows(const float* src, const int32_t* dst_row, int64_t routes,
                         int64_t routes_per_row, int64_t d, float* dst, int64_t dst_rows,
                         cudaStream_t stream) {
  if (routes <= 0 || d <= 0) return;
  if (d % 4 == 0 && aligned16(src) && aligned16(dst))
    permute_rows_kernel<4><<<row_blocks(routes), pack_threads(d / 4), 0, stream>>>(
        src, dst_row, routes, routes_per_row, d, dst, dst_rows);
  else
    permute_rows_kernel<1><<<row_blocks(routes), pack_threads(d), 0, stream>>>(
        src, dst_row, routes, routes_per_row, d, dst, dst_rows);
}

void launch_permute_rows_backward(const float* d_dst, int64_t dst_rows, const int32_t* dst_row,
                                  int64_t tokens, int64_t routes_per_row, int64_t d, float* d_src,
                                  cudaStream_t stream) {
  if (tokens <= 0 || d <= 0) return;
  if (d % 4 == 0 && aligned16(d_dst) && aligned16(d_src))
    permute_rows_backward_kernel<4><<<row_blocks(tokens), pack_threads(d / 4), 0, stream>>>(
        d_dst, dst_rows, dst_row, tokens, routes_per_row, d, d_src);
  else
    permute_rows_backward_kernel<1><<<row_blocks(tokens), pack_threads(d), 0, stream>>>(
        d_dst, dst_rows, dst_row, tokens, routes_per_row, d, d_src);
}

void launch_gather_rows(const float* src, int64_t src_rows, const int32_t* src_row, int64_t rows,
                        int64_t d, float* dst, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  if (d % 4 == 0 && aligned16(src) && aligned16(dst))
    gather_rows_kernel<4><<<row_blocks(rows), pack_threads(d / 4), 0, stream>>>(
        src, src_rows, src_row, rows, d, dst);
  else
    gather_rows_kernel<1>
        <<<row_blocks(rows), pack_threads(d), 0, stream>>>(src, src_rows, src_row, rows, d, dst);
}

}  // namespace moecore::kernels::cuda
