// RMSNorm: one block per row, its fp32 sums reduced in a fixed order (block_reduce.cuh), so a
// row's result does not depend on scheduling. dw sums rows in fixed
// chunks and then the chunks in order: run-to-run deterministic without float atomics.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kMaxRowThreads = 512;
constexpr int kColumnThreads = 256;
// dw's row chunks: long enough to amortise the partial sums' traffic, few enough that the scratch
// stays small; the count depends on rows only, so the summation order is fixed.
constexpr int64_t kDwChunkRows = 64;
constexpr int64_t kMaxDwChunks = 256;

// Whole warps (block_reduce needs them), no more threads than the row has elements.
int row_threads(int64_t dim) {
  const int64_t warps = (dim + 31) / 32;
  const int64_t threads = (warps > 0 ? warps : 1) * 32;
  return static_cast<int>(threads < kMaxRowThreads ? threads : kMaxRowThreads);
}

unsigned int column_blocks(int64_t dim) {
  return static_cast<unsigned int>((dim + kColumnThreads - 1) / kColumnThreads);
}

int64_t dw_chunks(int64_t rows) {
  const int64_t chunks = (rows + kDwChunkRows - 1) / kDwChunkRows;
  return chunks < kMaxDwChunks ? (chunks > 0 ? chunks : 1) : kMaxDwChunks;
}

// The CPU backend's expressions (kernels/cpu/rmsnorm.cpp), so that both round alike.
__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float* y, float* rstd,
                                       int64_t rows, int64_t dim, float eps) {
  __shared__ float warp_sums[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float sum_sq = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum_sq += xr[j] * xr[j];
    sum_sq = block_reduce(sum_sq, SumOp{}, 0.0f, warp_sums);
    // dim 0 gives 0 / 0: NaN, as the reference's.
    const float s = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = w[j] * (xr[j] * s);
  }
}

// dx = s (dy w - xhat mean(dy w xhat)), xhat = x s; dx is not read when overwritten (NaN there
// stays out of the result).
__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const float* w,
                                           const float* rstd, float* dx, int64_t rows, int64_t dim,
                                           bool accumulate_dx) {
  __shared__ float warp_sums[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * dim;
    const float* xr = x + r * dim;
    float* dxr = dx + r * dim;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dot += dyr[j] * w[j] * (xr[j] * s);
    const float mean_dot = block_reduce(dot, SumOp{}, 0.0f, warp_sums) / static_cast<float>(dim);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float g = s * (dyr[j] * w[j] - xr[j] * s * mean_dot);
      dxr[j] = accumulate_dx ? dxr[j] + g : g;
    }
  }
}

// Column j of row chunk blockIdx.y: sum of dy xhat over the chunk's rows in order, stored into
// out[chunk, j], or added to out[j] when there is one chunk (out is then dw itself).
__global__ void rmsnorm_dw_chunk_kernel(const float* dy, const float* x, const float* rstd,
                                        float* out, int64_t rows, int64_t dim, int64_t chunk_rows,
                                        bool add_to_out) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  const int64_t begin = blockIdx.y * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) sum += dy[r * dim + j] * (x[r * dim + j] * rstd[r]);
  float* o = out + blockIdx.y * dim + j;
  *o = add_to_out ? *o + sum : sum;
}

// dw[j] += the chunks' sums of column j, chunks in order.
__global__ void rmsnorm_dw_reduce_kernel(const float* partial, float* dw, int64_t chunks,
                                         int64_t dim) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) sum += partial[c * dim + j];
  dw[j] += sum;
}

}  // namespace

void launch_rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                            int64_t dim, float eps, cudaStream_t stream) {
  // dim 0 still writes rstd (NaN), so only rows decide whether there is work.
  if (rows > 0)
    rmsnorm_forward_kernel<<<row_blocks(rows), row_threads(dim), 0, stream>>>(x, w, y, rstd, rows,
                                                                              dim, eps);
}

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t dim) {
  const int64_t chunks = dw_chunks(rows);
  return rows > 0 && chunks > 1 ? chunks * dim : 0;
}

void launch_rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                             float* dx, float* dw, float* scratch, int64_t rows, int64_t dim,
                             bool accumulate_dx, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  rmsnorm_backward_dx_kernel<<<row_blocks(rows), row_threads(dim), 0, stream>>>(
      dy, x, w, rstd, dx, rows, dim, accumulate_dx);
  const int64_t chunks = dw_chunks(rows);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const dim3 grid(column_blocks(dim), static_cast<unsigned int>(chunks));
  if (chunks == 1) {
    rmsnorm_dw_chunk_kernel<<<grid, kColumnThreads, 0, stream>>>(dy, x, rstd, dw, rows, dim,
                                                                 chunk_rows, true);
  } else {
    rmsnorm_dw_chunk_kernel<<<grid, kColumnThreads, 0, stream>>>(dy, x, rstd, scratch, rows, dim,
                                                                 chunk_rows, false);
    rmsnorm_dw_reduce_kernel<<<column_blocks(dim), kColumnThreads, 0, stream>>>(scratch, dw, chunks,
                                                                                dim);
  }
}

}  // namespace moecore::kernels::cuda
