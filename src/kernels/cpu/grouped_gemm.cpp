// The grouped GEMM on the CPU: one GEMM per expert with rows, threaded as
// cpu/expert_parallel_for.h decides, reading the experts' weights in fp32 or as their bf16 copy.
//
// bf16 on the native path (bf16 GEMM instructions): the activation operands are rounded to bf16
// whole, once, before the experts' GEMMs read their rows: x in the forward; dy and x in the
// backward, where dy feeds both of an expert's GEMMs (dx and dw) and would otherwise be converted
// once for each. The rounding runs on the whole pool into the calling thread's scratch, whose
// size is the same every step, so that no expert's GEMM converts into, or grows, the scratch of
// whichever thread the schedule gave it (a step after the first then asks the heap for nothing).
// Same values rounded, same products. The emulated path multiplies fp32 values (a bf16 copy would
// be widened again per GEMM), and fp32 multiplies fp32: there each GEMM takes its operands as
// they are.
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

// The first `rows` rows of x [all_rows, cols] (the experts' rows; those after them belong to no
// expert) rounded to bf16 into `copy` (the calling thread's, kept across calls, sized for all
// rows: how many the experts have changes from step to step, the buffer's rows do not).
const uint16_t* rows_to_bf16(std::vector<uint16_t>& copy, const float* x, int64_t rows,
                             int64_t all_rows, int64_t cols) {
  uint16_t* const rounded = scratch_of_at_least(copy, all_rows * cols);
  convert_to_bf16(x, rows, cols, cols, rounded);
  return rounded;
}

// The experts' weights as the GEMMs read them: fp32, or the bf16 copy (no conversion per call).
class ExpertWeights {
 public:
  ExpertWeights(const char* op, ConstTensorView w, MatmulPrecision precision)
      : precision_(precision),
        fp32_(w.dtype() == DType::kBf16 ? nullptr : w.data<float>(op)),
        bf16_(w.dtype() == DType::kBf16 ? bf16_bits(op, w) : nullptr) {}

  // c = a op(w_e), w_e starting `offset` elements into w (contiguous, [out, in]), a fp32 with
  // row stride lda.
  void gemm(int64_t offset, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            int64_t lda, float* c, int64_t ldc) const {
    if (bf16_ != nullptr) {
      gemm_bf16_b16(bf16_gemm_path(), false, trans_b, m, n, k, 1.0f, a, lda, bf16_ + offset, 0.0f,
                    c, ldc);
    } else {
      kernels::gemm(precision_, false, trans_b, m, n, k, 1.0f, a, lda, fp32_ + offset,
                    trans_b ? k : n, 0.0f, c, ldc);
    }
  }
  // The same with a16 rows already rounded to bf16 (contiguous, [m, k]; gemms_read_bf16_bits).
  void gemm(int64_t offset, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a16,
            float* c, int64_t ldc) const {
    if (bf16_ != nullptr) {
      gemm_bf16_ab16(bf16_gemm_path(), false, trans_b, m, n, k, 1.0f, a16, bf16_ + offset, 0.0f, c,
                     ldc);
    } else {
      gemm_bf16_a16(bf16_gemm_path(), false, trans_b, m, n, k, 1.0f, a16, fp32_ + offset,
                    trans_b ? k : n, 0.0f, c, ldc);
    }
  }

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
  if (gemms_read_bf16_bits(precision)) {
    thread_local std::vector<uint16_t> x_copy;
    const uint16_t* x16 = rows_to_bf16(x_copy, xp, offsets[at(s.experts)], s.rows, s.in);
    for_each_expert(offsets, s.experts, [&](int64_t e) {
      const int64_t begin = offsets[at(e)];
      weights.gemm(e * s.out * s.in, true, offsets[at(e + 1)] - begin, s.out, s.in,
                   x16 + begin * s.in, yp + begin * s.out, s.out);
    });
    return;
  }
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)];
    weights.gemm(e * s.out * s.in, true, offsets[at(e + 1)] - begin, s.out, s.in, xp + begin * s.in,
                 s.in, yp + begin * s.out, s.out);
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
  if (gemms_read_bf16_bits(precision)) {
    thread_local std::vector<uint16_t> dy_copy, x_copy;
    const int64_t rows = offsets[at(s.experts)];
    const uint16_t* dy16 = rows_to_bf16(dy_copy, dyp, rows, s.rows, s.out);
    const uint16_t* x16 = rows_to_bf16(x_copy, xp, rows, s.rows, s.in);
    for_each_expert(offsets, s.experts, [&](int64_t e) {
      const int64_t begin = offsets[at(e)];
      const int64_t count = offsets[at(e + 1)] - begin;
      // dx_e = dy_e w_e; dw_e += dy_e^T x_e.
      if (input_grad)
        weights.gemm(e * s.out * s.in, false, count, s.in, s.out, dy16 + begin * s.out,
                     dxp + begin * s.in, s.in);
      gemm_bf16_ab16(bf16_gemm_path(), true, false, s.out, s.in, count, 1.0f, dy16 + begin * s.out,
                     x16 + begin * s.in, 1.0f, dwp + e * s.out * s.in, s.in);
    });
    return;
  }
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)];
    const int64_t count = offsets[at(e + 1)] - begin;
    const float* dye = dyp + begin * s.out;
    if (input_grad)
      weights.gemm(e * s.out * s.in, false, count, s.in, s.out, dye, s.out, dxp + begin * s.in,
                   s.in);
    gemm(precision, true, false, s.out, s.in, count, 1.0f, dye, s.out, xp + begin * s.in, s.in,
         1.0f, dwp + e * s.out * s.in, s.in);
  });
}

}  // namespace moecore::kernels::cpu
