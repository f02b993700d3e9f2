// Sum of squares on the CPU: fixed blocks summed in double over kSquaresLanes lanes, the block
// sums added in block order (core/deterministic_sum.h): the same bits for any thread count.
#include <algorithm>
#include <vector>

#include "core/deterministic_sum.h"
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch_vector.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

constexpr int64_t kSquaresBlock = 1024;
constexpr int64_t kSquaresLanes = 8;

// Squares of one block summed in double over kSquaresLanes lanes, added in lane order: a fixed
// order that vectorises.
MOECORE_SIMD_CLONES double block_sum_of_squares(const float* values, int64_t n) {
  double lanes[kSquaresLanes] = {};
  const int64_t full = n - n % kSquaresLanes;
  for (int64_t j = 0; j < full; j += kSquaresLanes)
    for (int64_t l = 0; l < kSquaresLanes; ++l) {
      const double v = static_cast<double>(values[j + l]);
      lanes[l] += v * v;
    }
  for (int64_t j = full; j < n; ++j) {
    const double v = static_cast<double>(values[j]);
    lanes[j - full] += v * v;
  }
  double total = 0.0;
  for (const double lane : lanes) total += lane;
  return total;
}

}  // namespace

void sum_of_squares(ConstTensorView values, TensorView total) {
  constexpr const char* kOp = "sum_of_squares";
  const int64_t n = values.numel();
  expect_shape(kOp, "values", values, {n});
  expect_shape(kOp, "total", total, {1});
  const float* v = values.data<float>(kOp);
  double* out = total.data<double>(kOp);
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  // The blocks' sums first, over all threads (deterministic_sum parallelises over chunks of 4096
  // blocks: a model's gradients make only a few), then added as deterministic_sum adds them.
  thread_local std::vector<double> block_sums;
  double* sums = scratch_of_at_least(block_sums, blocks);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kSquaresBlock;
    sums[b] = block_sum_of_squares(v + begin, std::min(kSquaresBlock, n - begin));
  }
  *out = deterministic_sum(blocks, [sums](int64_t b) { return sums[b]; });
}

}  // namespace moecore::kernels::cpu
