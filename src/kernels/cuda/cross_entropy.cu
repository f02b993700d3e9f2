// Softmax cross-entropy: a counting pass over the targets (the divisor the gradient needs), then
// one block per row (max, sum of exp, loss, dlogits), then one block that adds the row losses in
// double and divides. Every reduction has a fixed shape and no atomics, so the loss repeats bit for
// bit run to run. A target outside the vocabulary counts as ignored (nothing waits to check it).
#include <cmath>

#include "core/ignore_index.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kThreads = 512;   // per row: a vocabulary row is long, rows are few thousand
constexpr int kOneBlock = 256;  // the counting and summing passes
static_assert(kThreads % 32 == 0 && kThreads <= 1024 && kOneBlock % 32 == 0);

__device__ bool outside(int32_t target, int64_t vocab) {
  return target < 0 || target >= vocab;
}

// One block: the counted targets (neither the ignore index nor outside the vocabulary).
__global__ void count_kernel(const int32_t* targets, int64_t rows, int64_t vocab,
                             long long* counted_targets) {
  __shared__ long long counts[32];
  long long counted = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int32_t t = targets[r];
    if (t != kIgnoreIndex && !outside(t, vocab)) ++counted;
  }
  counted = block_reduce(counted, SumOp{}, 0LL, counts);
  if (threadIdx.x == 0) *counted_targets = counted;
}

// The loss of row r (logsumexp - target logit, in the CPU's fp32 steps) into row_loss[r] and, when
// dlogits is given, softmax * grad_scale minus grad_scale at the target; an ignored row has loss
// 0 and zero gradient. The divisor is *normalizer, or the counted targets without one.
__device__ double divisor_of(const double* normalizer, const long long* counted) {
  return normalizer != nullptr ? *normalizer : static_cast<double>(*counted);
}
__global__ void row_kernel(const float* logits, const int32_t* targets, float* dlogits,
                           int64_t rows, int64_t vocab, float scale, const double* normalizer,
                           const long long* counted, double* row_loss) {
  __shared__ float maxima[32], sums[32];
  const double divisor = divisor_of(normalizer, counted);
  const float grad_scale = divisor > 0 ? scale / static_cast<float>(divisor) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t target = targets[r];
    float* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    // Uniform over the block: every thread reads the same target.
    if (target == kIgnoreIndex || outside(target, vocab)) {
      if (dz != nullptr)
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) dz[j] = 0.0f;
      if (threadIdx.x == 0) row_loss[r] = 0.0;
      continue;
    }
    const float* z = logits + r * vocab;
    float max_z = -INFINITY;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) max_z = fmaxf(max_z, z[j]);
    max_z = block_reduce(max_z, MaxOp{}, -INFINITY, maxima);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(z[j] - max_z);
    sum = block_reduce(sum, SumOp{}, 0.0f, sums);
    const float log_sum = logf(sum);
    if (threadIdx.x == 0) row_loss[r] = static_cast<double>(log_sum + max_z - z[target]);
    if (dz != nullptr) {
      // __fmul_rn and __fsub_rn: no fma contraction, the CPU's two roundings.
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float grad = __fmul_rn(expf(z[j] - max_z - log_sum), grad_scale);
        dz[j] = j == target ? __fsub_rn(grad, grad_scale) : grad;
      }
    }
  }
}

// One block: the row losses added in double, each thread over a fixed stride, then a fixed tree;
// *loss = the sum over the divisor (0 without one).
__global__ void total_kernel(const double* row_loss, int64_t rows, const double* normalizer,
                             const long long* counted, double* loss) {
  __shared__ double sums[32];
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_loss[r];
  sum = block_reduce(sum, SumOp{}, 0.0, sums);
  if (threadIdx.x == 0) {
    const double divisor = divisor_of(normalizer, counted);
    *loss = divisor > 0 ? sum / divisor : 0.0;
  }
}

}  // namespace

void launch_cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t rows,
                          int64_t vocab, float scale, const double* normalizer, double* row_loss,
                          long long* counted, double* loss, cudaStream_t stream) {
  if (rows <= 0) return;
  const unsigned int blocks = static_cast<unsigned int>(rows < 65536 ? rows : 65536);
  count_kernel<<<1, kOneBlock, 0, stream>>>(targets, rows, vocab, counted);
  row_kernel<<<blocks, kThreads, 0, stream>>>(logits, targets, dlogits, rows, vocab, scale,
                                              normalizer, counted, row_loss);
  total_kernel<<<1, kOneBlock, 0, stream>>>(row_loss, rows, normalizer, counted, loss);
}

}  // namespace moecore::kernels::cuda
