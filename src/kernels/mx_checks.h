// The argument checks of the MX ops, shared by every backend: code views hold e4m3 or e5m2, scale
// views e8m0, one scale per 32 codes along the quantised (last) dimension, whose extent must be a
// positive multiple of 32 (mx::check_mx_contraction). Errors name the op and the argument. Each
// check takes the device the backend's views are on (the CPU's unless it says otherwise).
#pragma once

#include <cstdint>
#include <span>

#include "core/mx_types.h"
#include "kernels/grouped_gemm_checks.h"
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

// The element type a code view holds; anything but e4m3 / e5m2 is an error naming the op.
inline mx::ElemType mx_elem_type(const char* op, const char* name, DType dtype) {
  if (dtype == DType::kE4m3) return mx::ElemType::kE4M3;
  if (dtype == DType::kE5m2) return mx::ElemType::kE5M2;
  fail("[{}] {} must hold e4m3 or e5m2 codes, got {}", op, name, dtype_name(dtype));
}

// The bytes of a scale view (e8m0). Code views take their element type from mx_elem_type.
inline const uint8_t* mx_scale_bytes(const char* op, ConstTensorView v) {
  MOE_CHECK(v.dtype() == DType::kE8m0, "[{}] scales must be e8m0, got {}", op,
            dtype_name(v.dtype()));
  return static_cast<const uint8_t*>(v.raw());
}

// A view of rank 2 or 3 as [batch, rows, cols] (batch 1 for a matrix).
struct MxMatrixDims {
  int64_t batch, rows, cols;
};

template <bool kMutable>
MxMatrixDims mx_matrix_dims(const char* op, const char* name, const BasicTensorView<kMutable>& v) {
  MOE_CHECK(v.rank() == 2 || v.rank() == 3,
            "[{}] {} must be [rows, cols] or [batch, rows, cols], got rank {}", op, name, v.rank());
  if (v.rank() == 2) return {1, v.size(0), v.size(1)};
  return {v.size(0), v.size(1), v.size(2)};
}

// expect_shape for [batch, rows, cols] in the rank the caller used.
template <bool kMutable>
void expect_mx_shape(const char* op, const char* name, const BasicTensorView<kMutable>& v, int rank,
                     const MxMatrixDims& d, Device device = Device::kCpu) {
  if (rank == 2)
    expect_shape(op, name, v, {d.rows, d.cols}, device);
  else
    expect_shape(op, name, v, {d.batch, d.rows, d.cols}, device);
}

// The checked pointers of a quantisation: x (f32) [batch, rows, cols] in, codes and scales out,
// quantised along cols, or along rows when `transposed` (codes [batch, cols, rows]).
struct MxQuantizeArgs {
  MxMatrixDims x;
  const float* values;
  mx::ElemType elem;
  uint8_t* codes;
  uint8_t* scales;
};

inline MxQuantizeArgs mx_quantize_args(const char* op, ConstTensorView x, TensorView codes,
                                       TensorView scales, bool transposed,
                                       Device device = Device::kCpu) {
  const MxMatrixDims d = mx_matrix_dims(op, "x", x);
  const MxMatrixDims quantized = transposed ? MxMatrixDims{d.batch, d.cols, d.rows} : d;
  mx::check_mx_contraction(op, quantized.cols);
  expect_mx_shape(op, "x", x, x.rank(), d, device);
  const mx::ElemType elem = mx_elem_type(op, "codes", codes.dtype());
  expect_mx_shape(op, "codes", codes, x.rank(), quantized, device);
  expect_mx_shape(op, "scales", scales, x.rank(),
                  {quantized.batch, quantized.rows, quantized.cols / mx::kMxBlock}, device);
  mx_scale_bytes(op, scales);
  return {d, x.data<float>(op), elem, static_cast<uint8_t*>(codes.raw()),
          static_cast<uint8_t*>(scales.raw())};
}

// An MX operand, codes [rows, k] or [batch, rows, k], checked against its scales.
struct MxOperandArgs {
  MxMatrixDims dims;  // of the codes
  mx::MxOperand operand;
};

inline MxOperandArgs mx_operand_args(const char* op, const char* name, const MxOperandView& v,
                                     Device device = Device::kCpu) {
  const MxMatrixDims d = mx_matrix_dims(op, name, v.codes);
  mx::check_mx_contraction(op, d.cols);
  const mx::ElemType elem = mx_elem_type(op, name, v.codes.dtype());
  expect_mx_shape(op, name, v.codes, v.codes.rank(), d, device);
  expect_mx_shape(op, "scales", v.scales, v.codes.rank(), {d.batch, d.rows, d.cols / mx::kMxBlock},
                  device);
  return {d, {elem, static_cast<const uint8_t*>(v.codes.raw()), mx_scale_bytes(op, v.scales)}};
}

// mx_matmul's operands: a [M, K], b [N, K], c [M, N] (f32).
struct MxMatmulArgs {
  int64_t m, n, k;
  mx::MxOperand a, b;
  float* c;
};

inline MxMatmulArgs mx_matmul_args(const MxOperandView& a, const MxOperandView& b, TensorView c,
                                   Device device = Device::kCpu) {
  constexpr const char* kOp = "mx_matmul";
  MOE_CHECK(a.codes.rank() == 2 && b.codes.rank() == 2,
            "[{}] a and b must be matrices, got ranks {}, {}", kOp, a.codes.rank(), b.codes.rank());
  const MxOperandArgs lhs = mx_operand_args(kOp, "a", a, device);
  const MxOperandArgs rhs = mx_operand_args(kOp, "b", b, device);
  MOE_CHECK(lhs.dims.cols == rhs.dims.cols,
            "[{}] a [{}, {}] and b [{}, {}] contract over different extents", kOp, lhs.dims.rows,
            lhs.dims.cols, rhs.dims.rows, rhs.dims.cols);
  expect_shape(kOp, "c", c, {lhs.dims.rows, rhs.dims.rows}, device);
  return {lhs.dims.rows, rhs.dims.rows, lhs.dims.cols,
          lhs.operand,   rhs.operand,   c.data<float>(kOp)};
}

// A grouped MX GEMM, out[rows of e] = a[rows of e] . b[e]^T: a [R, k], b [E, n, k], out [R, n]
// (f32); the offsets are checked as grouped_gemm's.
struct MxGroupedArgs {
  GroupedGemmDims dims;  // rows R, experts E, out n, in k
  mx::MxOperand a, b;
  float* out;
};

inline MxGroupedArgs mx_grouped_args(const char* op, const MxOperandView& a, const MxOperandView& b,
                                     ConstTensorView expert_offsets, TensorView out,
                                     Device device = Device::kCpu) {
  MOE_CHECK(a.codes.rank() == 2 && b.codes.rank() == 3,
            "[{}] codes must be [R, k] and [E, n, k], got ranks {} and {}", op, a.codes.rank(),
            b.codes.rank());
  const MxOperandArgs lhs = mx_operand_args(op, "activations", a, device);
  const MxOperandArgs rhs = mx_operand_args(op, "weights", b, device);
  const GroupedGemmDims dims = grouped_gemm_dims(op, a.codes, b.codes, expert_offsets, device);
  expect_shape(op, "output", out, {dims.rows, dims.out}, device);
  return {dims, lhs.operand, rhs.operand, out.data<float>(op)};
}

// Expert e's slice of a grouped operand: rows [begin, begin + ...) of a [*, k] operand.
inline mx::MxOperand mx_rows_from(const mx::MxOperand& operand, int64_t begin, int64_t k) {
  return {operand.elem, operand.codes + begin * k, operand.scales + begin * (k / mx::kMxBlock)};
}

}  // namespace moecore::kernels
