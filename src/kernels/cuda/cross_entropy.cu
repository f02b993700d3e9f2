// Softmax cross-entropy and the LM head's z-loss: a counting pass over the targets (the divisor the
// gradient needs), then one block per row (max, sum of exp, losses, dlogits), then one block that
// adds the row losses in double and divides. Every reduction has a fixed shape and no atomics, so
// the loss repeats bit for bit run to run. A target outside the vocabulary counts as ignored
// (nothing waits to check it).
#include <cmath>

#include "core/ignore_index.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/loss_parts.h"

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

// The losses of row r (logsumexp - target logit and logsumexp^2, in the CPU's fp32 steps) into
// row_losses[r] and, when dlogits is given, softmax * grad_scale (1 + 2 z_loss_coef logsumexp)
// minus grad_scale at the target; an ignored row has losses 0 and zero gradient. The divisor is
// *normalizer, or the counted targets without one.
__device__ double divisor_of(const double* normalizer, const long long* counted) {
  return normalizer != nullptr ? *normalizer : static_cast<double>(*counted);
}
__global__ void row_kernel(const float* logits, const int32_t* targets, float* dlogits,
                           int64_t rows, int64_t vocab, float scale, float z_loss_coef,
                           const double* normalizer, const long long* counted, double* row_losses) {
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
      if (threadIdx.x == 0)
        row_losses[kHeadLosses * r + kHeadCe] = row_losses[kHeadLosses * r + kHeadZ] = 0.0;
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
    const float lse = __fadd_rn(log_sum, max_z);
    if (threadIdx.x == 0) {
      row_losses[kHeadLosses * r + kHeadCe] = static_cast<double>(__fsub_rn(lse, z[target]));
      // Exact: the square of a float fits a double's significand.
      row_losses[kHeadLosses * r + kHeadZ] = static_cast<double>(lse) * static_cast<double>(lse);
    }
    if (dz != nullptr) {
      // __fmul_rn, __fadd_rn and __fsub_rn: no fma contraction, the CPU's roundings.
      const float softmax_scale =
          z_loss_coef != 0.0f
              ? __fmul_rn(grad_scale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(2.0f, z_loss_coef), lse)))
              : grad_scale;
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float grad = __fmul_rn(expf(z[j] - max_z - log_sum), softmax_scale);
        dz[j] = j == target ? __fsub_rn(grad, grad_scale) : grad;
      }
    }
  }
}

// One block per loss: the row losses added in double, each thread over a fixed stride, then a
// fixed tree; losses[blockIdx.x] = the sum over the divisor (0 without one).
__global__ void total_kernel(const double* row_losses, int64_t rows, const double* normalizer,
                             const long long* counted, double* losses) {
  __shared__ double sums[32];
  const int part = static_cast<int>(blockIdx.x);
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    sum += row_losses[kHeadLosses * r + part];
  sum = block_reduce(sum, SumOp{}, 0.0, sums);
  if (threadIdx.x == 0) {
    const double divisor = divisor_of(normalizer, counted);
    losses[part] = divisor > 0 ? sum / divisor : 0.0;
  }
}

}  // namespace

void launch_cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t rows,
                          int64_t vocab, float scale, float z_loss_coef, const double* normalizer,
                          double* row_losses, long long* counted, double* losses,
                          cudaStream_t stream) {
  if (rows <= 0) return;
  const unsigned int blocks = static_cast<unsigned int>(rows < 65536 ? rows : 65536);
  count_kernel<<<1, kOneBlock, 0, stream>>>(targets, rows, vocab, counted);
  row_kernel<<<blocks, kThreads, 0, stream>>>(logits, targets, dlogits, rows, vocab, scale,
                                              z_loss_coef, normalizer, counted, row_losses);
  total_kernel<<<kHeadLosses, kOneBlock, 0, stream>>>(row_losses, rows, normalizer, counted,
                                                      losses);
}

}  // namespace moecore::kernels::cuda
