// MX dequantisation on the CPU: rows in parallel, each block's scale decoded once and its 32
// elements read from the decode table and multiplied by it (compiled per ISA, core/simd.h) — the
// same single fp32 multiply as mx::dequantize, so the same bits.
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cpu {

namespace {

MOECORE_SIMD_CLONES
void dequantize_row(const float* table, int64_t cols, const uint8_t* codes, const uint8_t* scales,
                    float* x) {
  for (int64_t b = 0; b < cols / mx::kMxBlock; ++b) {
    const float scale = mx::decode_e8m0(scales[b]);
    for (int64_t i = b * mx::kMxBlock; i < (b + 1) * mx::kMxBlock; ++i)
      x[i] = table[codes[i]] * scale;
  }
}

}  // namespace

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  constexpr const char* kOp = "mx_dequantize";
  const MxOperandArgs q = mx_operand_args(kOp, "codes", quantized);
  expect_mx_shape(kOp, "x", x, quantized.codes.rank(), q.dims);
  float* out = x.data<float>(kOp);
  const float* table = mx::elem_decode_table(q.operand.elem);
  const int64_t rows = q.dims.batch * q.dims.rows, cols = q.dims.cols;
  const int64_t blocks = cols / mx::kMxBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(table, cols, q.operand.codes + r * cols, q.operand.scales + r * blocks,
                   out + r * cols);
}

}  // namespace moecore::kernels::cpu
