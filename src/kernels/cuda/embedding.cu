// Token embedding: the forward copies one element per thread; the backward sorts the rows by
// token (CUB's stable radix sort) and adds each token's rows in row order, which makes repeated
// tokens' sums deterministic without float atomics and gives the CPU's bits. The ids are data on
// the device, checked beside these (index_checks.h: an error at the next synchronisation); the
// kernels leave a row with an id out of range alone (NaN in the forward, nothing added in the
// backward) instead of faulting.
#include <cub/device/device_radix_sort.cuh>
#include <cuda/std/limits>

#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void embedding_forward_kernel(const int32_t* tokens, const float* w, float* out,
                                         int64_t rows, int64_t vocab, int64_t dim) {
  const int64_t n = rows * dim;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / dim, j = i - r * dim;
    const int64_t token = tokens[r];
    out[i] = token >= 0 && token < vocab ? w[token * dim + j]
                                         : ::cuda::std::numeric_limits<float>::quiet_NaN();
  }
}

// Row r of the rows sorted by token, in order: iota for the sort's values.
__global__ void iota_kernel(int32_t* values, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) values[i] = static_cast<int32_t>(i);
}

// After a stable sort of the rows by token, each token's rows form a run, in row order. The block
// of a run's first position adds the run's rows into the token's gradient row one after another,
// starting from its value (the CPU's sequential order, so the same bits), its threads over the
// columns; the blocks of other positions, and the padding token's run, have nothing to do.
__global__ void embedding_backward_runs_kernel(const int32_t* sorted_tokens,
                                               const int32_t* sorted_rows, int64_t rows,
                                               const float* dout, float* dw, int64_t vocab,
                                               int64_t dim, int64_t padding_idx) {
  for (int64_t p = blockIdx.x; p < rows; p += gridDim.x) {
    const int32_t token = sorted_tokens[p];
    if ((p > 0 && sorted_tokens[p - 1] == token) || token < 0 || token >= vocab ||
        token == padding_idx)
      continue;
    float* row = dw + int64_t{token} * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      float sum = row[j];
      for (int64_t q = p; q < rows && sorted_tokens[q] == token; ++q)
        sum += dout[int64_t{sorted_rows[q]} * dim + j];
      row[j] = sum;
    }
  }
}

// The scratch: the sorted tokens, the row numbers before and after the sort, then CUB's own.
constexpr size_t kScratchAlign = 256;
size_t aligned(size_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}
size_t radix_sort_bytes(int64_t rows) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(rows));
  return bytes;
}

}  // namespace

void launch_embedding_forward(const int32_t* tokens, const float* w, float* out, int64_t rows,
                              int64_t vocab, int64_t dim, cudaStream_t stream) {
  const int64_t n = rows * dim;
  if (n > 0)
    embedding_forward_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(
        tokens, w, out, rows, vocab, dim);
}

size_t embedding_backward_scratch_bytes(int64_t rows) {
  if (rows == 0) return 0;
  return 3 * aligned(static_cast<size_t>(rows) * sizeof(int32_t)) + aligned(radix_sort_bytes(rows));
}

cudaError_t launch_embedding_backward(const int32_t* tokens, const float* dout, float* dw,
                                      int64_t rows, int64_t vocab, int64_t dim, int64_t padding_idx,
                                      void* scratch, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return cudaSuccess;
  const size_t index_bytes = aligned(static_cast<size_t>(rows) * sizeof(int32_t));
  auto* base = static_cast<unsigned char*>(scratch);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base);
  auto* row_numbers = reinterpret_cast<int32_t*>(base + index_bytes);
  auto* sorted_rows = reinterpret_cast<int32_t*>(base + 2 * index_bytes);
  void* sort_scratch = base + 3 * index_bytes;
  size_t sort_bytes = radix_sort_bytes(rows);
  iota_kernel<<<elementwise_blocks(rows), kElementThreads, 0, stream>>>(row_numbers, rows);
  // Radix sort is stable: each token's rows keep their order. All 32 bits: an id outside the
  // vocabulary (negative ones too) sorts somewhere and is skipped.
  const cudaError_t sorted =
      cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, tokens, sorted_tokens, row_numbers,
                                      sorted_rows, static_cast<int>(rows), 0, 32, stream);
  if (sorted != cudaSuccess) return sorted;
  embedding_backward_runs_kernel<<<row_blocks(rows), kElementThreads, 0, stream>>>(
      sorted_tokens, sorted_rows, rows, dout, dw, vocab, dim, padding_idx);
  return cudaGetLastError();
}

}  // namespace moecore::kernels::cuda
