// The grouped GEMM on the CPU: one kernels::gemm per expert with rows, threaded as
// cpu/expert_parallel_for.h decides, reading the experts' weights in fp32 or as their bf16 copy.
// In the backward over a bf16 copy on the native bf16 path, an expert's rows of dy are rounded to
// bf16 once for both of its GEMMs (dx and dw), as are its rows of x for dw: the GEMMs would
// convert dy once each. (The emulated path multiplies fp32 values: bf16 copies would be widened
// again per GEMM, so there each GEMM rounds its operands.)
#include <vector>

#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/expert_parallel_for.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch_vector.h"
#include "kernels/grouped_gemm_checks.h"

namespace moecore::kernels::cpu {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
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

  // The bf16 copy's bits, or nullptr when the GEMMs read fp32 weights.
  const uint16_t* bf16() const { return bf16_; }

 private:
  MatmulPrecision precision_;
  const float* fp32_;
  const uint16_t* bf16_;
};

}  // namespace

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w, ConstTensorView expert_offsets,
                          TensorView y, MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm";
  expect_weight_dtype(kOp, "w", w, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  const std::span<const int64_t> offsets = host_expert_offsets(kOp, expert_offsets, s);
  expect_shape(kOp, "y", y, {s.rows, s.out});
  const float* xp = x.data<float>(kOp);
  const ExpertWeights weights(kOp, w, precision);
  float* yp = y.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)];
    const int64_t count = offsets[at(e + 1)] - begin;
    weights.gemm(e * s.out * s.in, false, true, count, s.out, s.in, xp + begin * s.in, s.in, 0.0f,
                 yp + begin * s.out, s.out);
  });
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm_backward";
  expect_weight_dtype(kOp, "w", w, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  const std::span<const int64_t> offsets = host_expert_offsets(kOp, expert_offsets, s);
  expect_shape(kOp, "dy", dy, {s.rows, s.out});
  const bool input_grad = dx.raw() != nullptr;
  if (input_grad) expect_shape(kOp, "dx", dx, {s.rows, s.in});
  expect_shape(kOp, "dw", dw, {s.experts, s.out, s.in});
  const float* dyp = dy.data<float>(kOp);
  const float* xp = x.data<float>(kOp);
  const ExpertWeights weights(kOp, w, precision);
  float* dxp = input_grad ? dx.data<float>(kOp) : nullptr;
  float* dwp = dw.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)];
    const int64_t count = offsets[at(e + 1)] - begin;
    const float* dye = dyp + begin * s.out;
    if (weights.bf16() != nullptr && bf16_gemm_path() == Bf16GemmPath::kNative) {
      // This thread's copies of the expert's rows, capacity kept across calls.
      thread_local std::vector<uint16_t> dy16, x16;
      uint16_t* const dy16_rows = scratch_of_at_least(dy16, count * s.out);
      uint16_t* const x16_rows = scratch_of_at_least(x16, count * s.in);
      convert_to_bf16(dye, count, s.out, s.out, dy16_rows);
      convert_to_bf16(xp + begin * s.in, count, s.in, s.in, x16_rows);
      const Bf16GemmPath path = bf16_gemm_path();
      if (input_grad)
        gemm_bf16_ab16(path, false, false, count, s.in, s.out, 1.0f, dy16_rows,
                       weights.bf16() + e * s.out * s.in, 0.0f, dxp + begin * s.in, s.in);
      gemm_bf16_ab16(path, true, false, s.out, s.in, count, 1.0f, dy16_rows, x16_rows, 1.0f,
                     dwp + e * s.out * s.in, s.in);
      return;
    }
    if (input_grad)
      weights.gemm(e * s.out * s.in, false, false, count, s.in, s.out, dye, s.out, 0.0f,
                   dxp + begin * s.in, s.in);
    gemm(precision, true, false, s.out, s.in, count, 1.0f, dye, s.out, xp + begin * s.in, s.in,
         1.0f, dwp + e * s.out * s.in, s.in);
  });
}

}  // namespace moecore::kernels::cpu
