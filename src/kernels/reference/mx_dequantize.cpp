// MX dequantisation, the plain-loop oracle: decoded element times decoded scale, per element (a
// bf16 output: that value rounded by float_to_bf16).
#include "kernels/mx_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/weight_values.h"

namespace moecore::kernels::reference {

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  constexpr const char* kOp = "mx_dequantize";
  const MxOperandArgs q = mx_operand_args(kOp, "codes", quantized);
  expect_mx_shape(kOp, "x", x, quantized.codes.rank(), q.dims);
  expect_f32_or_bf16(kOp, "x", x);
  const int64_t rows = q.dims.batch * q.dims.rows, cols = q.dims.cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      store_output(
          kOp, x, r * cols + c,
          mx::decode_elem(q.operand.elem, q.operand.codes[r * cols + c]) *
              mx::decode_e8m0(q.operand.scales[r * (cols / mx::kMxBlock) + c / mx::kMxBlock]));
}

}  // namespace moecore::kernels::reference
