// Token embedding: the forward copies one element per thread; the backward adds in row order,
// which makes repeated tokens' sums deterministic without float atomics. The ids are data on the
// device, checked beside these (index_checks.h: an error at the next synchronisation); the
// kernels leave a row with an id out of range alone (NaN in the forward, nothing added in the
// backward) instead of faulting.
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

// One thread per column, looping over the rows in order: simple, not fast (only dim threads, each
// walking every row). A faster form would sort the rows by token first and sum each token's run.
__global__ void embedding_backward_kernel(const int32_t* tokens, const float* dout, float* dw,
                                          int64_t rows, int64_t vocab, int64_t dim) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= dim) return;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = tokens[r];
    if (token >= 0 && token < vocab) dw[token * dim + j] += dout[r * dim + j];
  }
}

}  // namespace

void launch_embedding_forward(const int32_t* tokens, const float* w, float* out, int64_t rows,
                              int64_t vocab, int64_t dim, cudaStream_t stream) {
  const int64_t n = rows * dim;
  if (n > 0)
    embedding_forward_kernel<<<elementwise_blocks(n), kElementThreads, 0, stream>>>(
        tokens, w, out, rows, vocab, dim);
}

void launch_embedding_backward(const int32_t* tokens, const float* dout, float* dw, int64_t rows,
                               int64_t vocab, int64_t dim, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  const auto blocks = static_cast<unsigned int>((dim + kElementThreads - 1) / kElementThreads);
  embedding_backward_kernel<<<blocks, kElementThreads, 0, stream>>>(tokens, dout, dw, rows, vocab,
                                                                    dim);
}

}  // namespace moecore::kernels::cuda
