// The grouped GEMM on the CPU: one kernels::gemm per expert with rows. With many rows per expert,
// one expert at a time with multithreaded GEMMs. With few (128 experts top-4 on 2048 tokens: ~64
// rows each), each such GEMM is too small to split over the threads; its thread start-up and
// barriers cost more than the work. Then the experts run in parallel instead, each on one thread
// (oneDNN runs single-threaded inside a parallel region), biggest first so that the threads finish
// together. The policy depends only on the offsets and the thread count, so the GEMMs of a
// forward and of its backward see the same shapes and the same threading.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/expert_parallel_for.h"
#include "kernels/grouped_gemm_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w,
                          std::span<const int64_t> expert_offsets, TensorView y,
                          MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm";
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  expect_shape(kOp, "y", y, {s.rows, s.out});
  const float* xp = x.data<float>(kOp);
  const float* wp = w.data<float>(kOp);
  float* yp = y.data<float>(kOp);
  for_each_expert(expert_offsets, s.experts, [&](int64_t e) {
    const int64_t begin = expert_offsets[at(e)];
    const int64_t count = expert_offsets[at(e + 1)] - begin;
    gemm(precision, false, true, count, s.out, s.in, 1.0f, xp + begin * s.in, s.in,
         wp + e * s.out * s.in, s.in, 0.0f, yp + begin * s.out, s.out);
  });
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           std::span<const int64_t> expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm_backward";
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  expect_shape(kOp, "dy", dy, {s.rows, s.out});
  expect_shape(kOp, "dx", dx, {s.rows, s.in});
  expect_shape(kOp, "dw", dw, {s.experts, s.out, s.in});
  const float* dyp = dy.data<float>(kOp);
  const float* xp = x.data<float>(kOp);
  const float* wp = w.data<float>(kOp);
  float* dxp = dx.data<float>(kOp);
  float* dwp = dw.data<float>(kOp);
  for_each_expert(expert_offsets, s.experts, [&](int64_t e) {
    const int64_t begin = expert_offsets[at(e)];
    const int64_t count = expert_offsets[at(e + 1)] - begin;
    const float* dye = dyp + begin * s.out;
    gemm(precision, false, false, count, s.in, s.out, 1.0f, dye, s.out, wp + e * s.out * s.in, s.in,
         0.0f, dxp + begin * s.in, s.in);
    gemm(precision, true, false, s.out, s.in, count, 1.0f, dye, s.out, xp + begin * s.in, s.in,
         1.0f, dwp + e * s.out * s.in, s.in);
  });
}

}  // namespace moecore::kernels
