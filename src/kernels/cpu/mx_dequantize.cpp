// MX dequantisation on the CPU: mx::dequantize (core/mx_types.h), rows in parallel.
#include "kernels/mx_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels {

void mx_dequantize(MxOperandView quantized, TensorView x) {
  constexpr const char* kOp = "mx_dequantize";
  const MxOperandArgs q = mx_operand_args(kOp, "codes", quantized);
  expect_mx_shape(kOp, "x", x, quantized.codes.rank(), q.dims);
  mx::dequantize(q.operand.elem, q.dims.batch * q.dims.rows, q.dims.cols, q.operand.codes,
                 q.operand.scales, x.data<float>(kOp));
}

}  // namespace moecore::kernels
