// Sum of squares in double, deterministic: the partition into blocks depends on n only (at most
// kSumOfSquaresPartials blocks of kThreads threads, each thread striding the grid), each block's
// total comes out of a fixed tree, and one block adds the block totals in a fixed order. No
// atomics, so the bits repeat run to run (the gradient norm, and so clipping, must).
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % 32 == 0 && kThreads <= 1024);

__global__ void partial_sums_kernel(const float* values, int64_t n, double* partials) {
  __shared__ double warp_sums[32];
  double sum = 0.0;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const double v = values[i];
    sum += v * v;
  }
  sum = block_reduce(sum, SumOp{}, 0.0, warp_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void total_kernel(const double* partials, int count, double* total) {
  __shared__ double warp_sums[32];
  double sum = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x))
    sum += partials[i];
  sum = block_reduce(sum, SumOp{}, 0.0, warp_sums);
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace

void launch_sum_of_squares(const float* values, int64_t n, double* partials, double* total,
                           cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks =
      static_cast<int>(wanted < kSumOfSquaresPartials ? wanted : kSumOfSquaresPartials);
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(values, n, partials);
  total_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, total);
}

}  // namespace moecore::kernels::cuda
