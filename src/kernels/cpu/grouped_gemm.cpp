// The grouped GEMM on the CPU: one GEMM per expert with rows, threaded as
// cpu/expert_parallel_for.h decides, reading the experts' weights in fp32 or as their bf16 copy.
//
// Activation operands (x; dy and x in the backward) arrive in fp32 or, in bf16, as bf16 bits (the
// experts keep theirs in bf16: model/grouped_experts.h). A bf16 GEMM multiplies bf16 bits on the
// native path and bf16 values held in fp32 on the emulated one (kernels/gemm.h). Either way each
// activation operand is brought to that form whole, once, in the calling thread's scratch, before
// the experts' GEMMs read its rows: dy in the backward feeds both of an expert's GEMMs (dx and dw)
// and would otherwise be converted once for each, and the scratch's size (the pool's rows, which
// the experts share out differently from step to step) is the same every step (under expert
// parallelism: until a rank receives more rows than in any step before), so that no expert's
// GEMM converts into, or grows, the scratch of whichever thread the schedule gave it (a step
// after the first then asks the heap for nothing). The emulated path's GEMMs are then plain
// sgemms: an expert's weight in bf16 values (its fp32 weight rounded, or its bf16 copy widened) in
// the scratch of the thread running it, which every thread of the team is given before the
// experts start. Same values rounded, same products.
#include <omp.h>

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

// How one call's GEMMs multiply: fp32 values (fp32 precision), bf16 bits (bf16 on the native
// path) or bf16 values held in fp32 (bf16 on the emulated path, whose sgemm reads them as they
// are).
enum class Form { kFp32, kBf16Bits, kBf16Values };

Form form_of(MatmulPrecision precision) {
  if (precision != MatmulPrecision::kBf16) return Form::kFp32;
  return gemms_read_bf16_bits(precision) ? Form::kBf16Bits : Form::kBf16Values;
}

// An activation operand as the experts' GEMMs read it: fp32 values (in kFp32 and kBf16Values) or
// bf16 bits (kBf16Bits). Only the experts' first `rows` rows are converted; those past them belong
// to no expert and are neither read nor converted.
struct RowsOperand {
  const float* fp32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

// The calling thread's copies of the operands it converts, kept across calls and sized for all
// of an operand's rows.
struct RowsCopy {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

RowsOperand rows_operand(const char* op, ConstTensorView v, int64_t rows, Form form,
                         RowsCopy& copy) {
  const int64_t all_rows = v.size(0), cols = v.size(1);
  if (v.dtype() == DType::kBf16) {
    const uint16_t* bits = bf16_bits(op, v);
    if (form == Form::kBf16Bits) return {nullptr, bits};
    float* values = scratch_of_at_least(copy.values, all_rows * cols);
    widen_bf16(bits, rows * cols, values);
    return {values, nullptr};
  }
  const float* values = v.data<float>(op);
  switch (form) {
    case Form::kFp32:
      return {values, nullptr};
    case Form::kBf16Bits: {
      uint16_t* bits = scratch_of_at_least(copy.bits, all_rows * cols);
      convert_to_bf16(values, rows, cols, cols, bits);
      return {nullptr, bits};
    }
    case Form::kBf16Values: {
      float* rounded = scratch_of_at_least(copy.values, all_rows * cols);
      round_to_bf16(values, rows, cols, cols, rounded);
      return {rounded, nullptr};
    }
  }
  return {};
}

// This thread's buffer for one expert's weight in bf16 values (kBf16Values).
std::vector<float>& weight_values_scratch() {
  thread_local std::vector<float> values;
  return values;
}

// Every thread of the team the experts' GEMMs run on given room for one expert's weight (numel
// values) before they start, so that a thread's first expert in a later step does not grow its
// buffer: which threads run experts, and which of their weights, depends on the step's routing.
void reserve_weight_values(int64_t numel) {
  if (omp_in_parallel() != 0) {
    scratch_of_at_least(weight_values_scratch(), numel);
    return;
  }
#pragma omp parallel
  scratch_of_at_least(weight_values_scratch(), numel);
}

// The experts' weights as the GEMMs read them: fp32, or the bf16 copy (no conversion per call on
// the native path).
class ExpertWeights {
 public:
  ExpertWeights(const char* op, ConstTensorView w, Form form)
      : form_(form),
        fp32_(w.dtype() == DType::kBf16 ? nullptr : w.data<float>(op)),
        bf16_(w.dtype() == DType::kBf16 ? bf16_bits(op, w) : nullptr) {
    if (form_ == Form::kBf16Values) reserve_weight_values(w.size(1) * w.size(2));
  }

  // c = a op(w_e), w_e starting `offset` elements into w (contiguous, [out, in]) and op(w_e)
  // [k, n]; a fp32 values with row stride lda (kFp32, kBf16Values).
  void gemm(int64_t offset, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            int64_t lda, float* c, int64_t ldc) const {
    const float* w = form_ == Form::kBf16Values ? bf16_values(offset, k * n) : fp32_ + offset;
    gemm_fp32(false, trans_b, m, n, k, 1.0f, a, lda, w, trans_b ? k : n, 0.0f, c, ldc);
  }
  // The same with a16 rows in bf16 bits (contiguous, [m, k]; kBf16Bits).
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
  // One expert's weight (numel values from offset) in bf16 values, in this thread's scratch.
  const float* bf16_values(int64_t offset, int64_t numel) const {
    float* out = scratch_of_at_least(weight_values_scratch(), numel);
    if (bf16_ != nullptr)
      widen_bf16(bf16_ + offset, numel, out);
    else
      round_to_bf16(fp32_ + offset, 1, numel, numel, out);
    return out;
  }

  Form form_;
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
  const Form form = form_of(precision);
  thread_local RowsCopy x_copy;
  const RowsOperand xs = rows_operand(kOp, x, offsets[at(s.experts)], form, x_copy);
  const ExpertWeights weights(kOp, w, form);
  float* yp = y.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)], count = offsets[at(e + 1)] - begin;
    if (form == Form::kBf16Bits)
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
  const Form form = form_of(precision);
  const int64_t rows = offsets[at(s.experts)];
  thread_local RowsCopy dy_copy, x_copy;
  const RowsOperand dys = rows_operand(kOp, dy, rows, form, dy_copy);
  const RowsOperand xs = rows_operand(kOp, x, rows, form, x_copy);
  const ExpertWeights weights(kOp, w, form);
  float* dxp = input_grad ? dx.data<float>(kOp) : nullptr;
  float* dwp = dw.data<float>(kOp);
  for_each_expert(offsets, s.experts, [&](int64_t e) {
    const int64_t begin = offsets[at(e)], count = offsets[at(e + 1)] - begin;
    float* dwe = dwp + e * s.out * s.in;
    // dx_e = dy_e w_e; dw_e += dy_e^T x_e.
    if (form == Form::kBf16Bits) {
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
    gemm_fp32(true, false, s.out, s.in, count, 1.0f, dys.fp32 + begin * s.out, s.out,
              xs.fp32 + begin * s.in, s.in, 1.0f, dwe, s.in);
  });
}

}  // namespace moecore::kernels::cpu
