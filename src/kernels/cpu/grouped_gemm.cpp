// The grouped GEMM on the CPU: one GEMM per expert with rows, threaded as
// cpu/expert_parallel_for.h decides, reading the experts' weights in fp32 or as their bf16 copy.
//
// Activation operands (x; dy and x in the backward) arrive in fp32 or, in bf16, as bf16 bits (the
// experts keep theirs in bf16: model/grouped_experts.h). Where the GEMMs multiply bf16 bits (the
// native path) an fp32 operand is rounded to bf16 whole, once, before the experts' GEMMs read
// its rows: dy in the backward feeds both of an expert's GEMMs (dx and dw) and would otherwise be
// converted once for each. The rounding runs on the whole pool into the calling thread's scratch,
// whose size is the same every step, so that no expert's GEMM converts into, or grows, the
// scratch of whichever thread the schedule gave it (a step after the first then asks the heap for
// nothing). Same values rounded, same products. The emulated path multiplies fp32 values: there
// fp32 operands are taken as they are and bf16 ones widened by each GEMM, except in a backward
// given one bf16 operand, which rounds the other too (one kind of GEMM per operand pair).
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

// An activation operand as the experts' GEMMs read it: bf16 bits (given so, or rounded here when
// `to_bits`: rows past `rows` are the buffer's tail, neither read nor rounded) or fp32 values.
struct RowsOperand {
  const float* fp32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

RowsOperand rows_operand(const char* op, ConstTensorView v, int64_t rows, bool to_bits,
                         std::vector<uint16_t>& copy) {
  if (v.dtype() == DType::kBf16) return {nullptr, bf16_bits(op, v)};
  const float* values = v.data<float>(op);
  if (!to_bits) return {values, nullptr};
  return {nullptr, rows_to_bf16(copy, values, rows, v.size(0), v.size(1))};
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
  expect_activation_dtype(kOp, "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  const std::span<const int64_t> offsets = host_expert_offsets(kOp, expert_offsets, s);
  expect_shape(kOp, "y", y, {s.rows, s.out});
  thread_local std::vector<uint16_t> x_copy;
  const RowsOperand xs =
      rows_operand(kOp, x, offsets[at(s.experts)], gemms_read_bf16_bits(precision), x_copy);
  const ExpertWeights weights(kOp, w, precision);
  float* yp = y.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)], count = offsets[at(e + 1)] - begin;
    if (xs.bf16 != nullptr)
      weights.gemm(e * s.out * s.in, true, count, s.out, s.in, xs.bf16 + begin * s.in,
                   yp + begin * s.out, s.out);
    else
      weights.gemm(e * s.out * s.in, true, count, s.out, s.in, xs.fp32 + begin * s.in, s.in,
                   yp + begin * s.out, s.out);
  });
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm_backward";
  expect_weight_dtype(kOp, "w", w, precision);
  expect_activation_dtype(kOp, "dy", dy, precision);
  expect_activation_dtype(kOp, "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets);
  const std::span<const int64_t> offsets = host_expert_offsets(kOp, expert_offsets, s);
  expect_shape(kOp, "dy", dy, {s.rows, s.out});
  const bool input_grad = dx.raw() != nullptr;
  if (input_grad) expect_shape(kOp, "dx", dx, {s.rows, s.in});
  expect_shape(kOp, "dw", dw, {s.experts, s.out, s.in});
  // Both operands in bf16 bits where the GEMMs read them, or where either arrives so (one kind of
  // GEMM per operand pair: a bf16 operand's values are exact in fp32, so rounding the other too
  // gives the products of the values).
  const bool bits =
      gemms_read_bf16_bits(precision) || dy.dtype() == DType::kBf16 || x.dtype() == DType::kBf16;
  const int64_t rows = offsets[at(s.experts)];
  thread_local std::vector<uint16_t> dy_copy, x_copy;
  const RowsOperand dys = rows_operand(kOp, dy, rows, bits, dy_copy);
  const RowsOperand xs = rows_operand(kOp, x, rows, bits, x_copy);
  const ExpertWeights weights(kOp, w, precision);
  float* dxp = input_grad ? dx.data<float>(kOp) : nullptr;
  float* dwp = dw.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)], count = offsets[at(e + 1)] - begin;
    float* dwe = dwp + e * s.out * s.in;
    // dx_e = dy_e w_e; dw_e += dy_e^T x_e.
    if (bits) {
      if (input_grad)
        weights.gemm(e * s.out * s.in, false, count, s.in, s.out, dys.bf16 + begin * s.out,
                     dxp + begin * s.in, s.in);
      gemm_bf16_ab16(bf16_gemm_path(), true, false, s.out, s.in, count, 1.0f,
                     dys.bf16 + begin * s.out, xs.bf16 + begin * s.in, 1.0f, dwe, s.in);
      return;
    }
    if (input_grad)
      weights.gemm(e * s.out * s.in, false, count, s.in, s.out, dys.fp32 + begin * s.out, s.out,
                   dxp + begin * s.in, s.in);
    gemm(precision, true, false, s.out, s.in, count, 1.0f, dys.fp32 + begin * s.out, s.out,
         xs.fp32 + begin * s.in, s.in, 1.0f, dwe, s.in);
  });
}

}  // namespace moecore::kernels::cpu
