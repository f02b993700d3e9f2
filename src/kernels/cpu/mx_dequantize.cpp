// MX dequantisation on the CPU: rows in parallel, each block's scale decoded once and its 32
// elements read from the decode table and multiplied by it (compiled per ISA, core/simd.h) — the
// same single fp32 multiply as mx::dequantize, so the same bits; a bf16 output rounds that value by
// float_to_bf16 in the same pass.
#include "core/bf16.h"
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cpu {

namespace {

template <typename Out>
MOECORE_SIMD_CLONES void dequantize_row(const float* table, int64_t cols, const uint8_t* codes,
                                        const uint8_t* scales, Out* x) {
  for (int64_t b = 0; b < cols / mx::kMxBlock; ++b) {
    const float scale = mx::decode_e8m0(scales[b]);
    for (int64_t i = b * mx::kMxBlock; i < (b + 1) * mx::kMxBlock; ++i)
      store_value(x + i, table[codes[i]] * scale);
  }
}

template <typename Out>
void dequantize_rows(const float* table, int64_t rows, int64_t cols, const uint8_t* codes,
                     const uint8_t* scales, Out* out) {
  const int64_t blocks = cols / mx::kMxBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(table, cols, codes + r * cols, scales + r * blocks, out + r * cols);
}

}  // namespace

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  constexpr const char* kOp = "mx_dequantize";
  const MxOperandArgs q = mx_operand_args(kOp, "codes", quantized);
  expect_mx_shape(kOp, "x", x, quantized.codes.rank(), q.dims);
  expect_f32_or_bf16(kOp, "x", x);
  const float* table = mx::elem_decode_table(q.operand.elem);
  const int64_t rows = q.dims.batch * q.dims.rows, cols = q.dims.cols;
  if (x.dtype() == DType::kBf16)
    dequantize_rows(table, rows, cols, q.operand.codes, q.operand.scales, bf16_bits(kOp, x));
  else
    dequantize_rows(table, rows, cols, q.operand.codes, q.operand.scales, x.data<float>(kOp));
}

}  // namespace moecore::kernels::cpu
