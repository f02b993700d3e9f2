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

#include "kernels/grouped_gemm_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

constexpr int64_t kRowsPerThreadedExpert = 256;

// Experts with rows, biggest first; empty when one expert at a time is the better choice.
std::vector<int64_t> parallel_expert_order(std::span<const int64_t> offsets, int64_t experts) {
  std::vector<int64_t> order;
  for (int64_t e = 0; e < experts; ++e)
    if (offsets[at(e + 1)] > offsets[at(e)]) order.push_back(e);
  const int64_t threads = omp_get_max_threads();
  if (threads <= 1 || order.size() < 2 || omp_in_parallel() != 0) return {};
  const int64_t rows = offsets[at(experts)];
  if (rows >= kRowsPerThreadedExpert * static_cast<int64_t>(order.size())) return {};
  auto rows_of = [&](int64_t e) { return offsets[at(e + 1)] - offsets[at(e)]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows_of(a) > rows_of(b); });
  return order;
}

// Runs expert(e) for every expert with rows, in whichever way parallel_expert_order picks.
template <typename F>
void for_each_expert(std::span<const int64_t> offsets, int64_t experts, F&& expert) {
  const std::vector<int64_t> order = parallel_expert_order(offsets, experts);
  if (order.empty()) {
    for (int64_t e = 0; e < experts; ++e)
      if (offsets[at(e + 1)] > offsets[at(e)]) expert(e);
    return;
  }
  const int64_t n = static_cast<int64_t>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) expert(order[at(i)]);
}

// The experts' weights as the GEMMs read them: fp32, or the bf16 copy (no conversion per call).
class ExpertWeights {
 public:
  ExpertWeights(const char* op, ConstTensorView w, MatmulPrecision precision)
      : precision_(precision),
        fp32_(w.dtype() == DType::kBf16 ? nullptr : w.data<float>(op)),
        bf16_(w.dtype() == DType::kBf16 ? bf16_bits(op, w) : nullptr) {}

  // c = a op(w_e) + beta c, w_e starting `offset` elements into w (contiguous, [out, in]).
  void gemm(int64_t offset, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            const float* a, int64_t lda, float beta, float* c, int64_t ldc) const {
    const int64_t ldb = trans_b ? k : n;
    if (bf16_ != nullptr) {
      gemm_bf16_b16(bf16_gemm_path(), trans_a, trans_b, m, n, k, 1.0f, a, lda, bf16_ + offset, beta,
                    c, ldc);
    } else {
      kernels::gemm(precision_, trans_a, trans_b, m, n, k, 1.0f, a, lda, fp32_ + offset, ldb, beta,
                    c, ldc);
    }
  }

 private:
  MatmulPrecision precision_;
  const float* fp32_;
  const uint16_t* bf16_;
};

}  // namespace

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w,
                          std::span<const int64_t> expert_offsets, TensorView y,
                          MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm";
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets, precision);
  expect_shape(kOp, "y", y, {s.rows, s.out});
  const float* xp = x.data<float>(kOp);
  const ExpertWeights weights(kOp, w, precision);
  float* yp = y.data<float>(kOp);
  for_each_expert(expert_offsets, s.experts, [&](int64_t e) {
    const int64_t begin = expert_offsets[at(e)];
    const int64_t count = expert_offsets[at(e + 1)] - begin;
    weights.gemm(e * s.out * s.in, false, true, count, s.out, s.in, xp + begin * s.in, s.in, 0.0f,
                 yp + begin * s.out, s.out);
  });
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           std::span<const int64_t> expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm_backward";
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets, precision);
  expect_shape(kOp, "dy", dy, {s.rows, s.out});
  expect_shape(kOp, "dx", dx, {s.rows, s.in});
  expect_shape(kOp, "dw", dw, {s.experts, s.out, s.in});
  const float* dyp = dy.data<float>(kOp);
  const float* xp = x.data<float>(kOp);
  const ExpertWeights weights(kOp, w, precision);
  float* dxp = dx.data<float>(kOp);
  float* dwp = dw.data<float>(kOp);
  for_each_expert(expert_offsets, s.experts, [&](int64_t e) {
    const int64_t begin = expert_offsets[at(e)];
    const int64_t count = expert_offsets[at(e + 1)] - begin;
    const float* dye = dyp + begin * s.out;
    weights.gemm(e * s.out * s.in, false, false, count, s.in, s.out, dye, s.out, 0.0f,
                 dxp + begin * s.in, s.in);
    gemm(precision, true, false, s.out, s.in, count, 1.0f, dye, s.out, xp + begin * s.in, s.in,
         1.0f, dwp + e * s.out * s.in, s.in);
  });
}

}  // namespace moecore::kernels
