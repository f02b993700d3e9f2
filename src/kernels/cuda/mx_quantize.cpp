// MX quantisation and dequantisation on the GPU (mx_quantize.cu), bit-identical to
// kernels/reference: every code, scale and dequantised value has the CPU's bits. The views are
// checked as every backend checks them (kernels/mx_checks.h), on the device.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/mx_device_types.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cuda {

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  constexpr const char* kOp = "mx_quantize";
  expect_on_device(kOp, "x", x);
  const MxQuantizeArgs q = mx_quantize_args(kOp, x, codes, scales, false, Device::kCuda);
  launch_mx_quantize(q.values, q.x.batch * q.x.rows, q.x.cols, device_elem(q.elem),
                     device_scale_rule(mode), q.codes, q.scales, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_mx_quantize");
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  constexpr const char* kOp = "mx_quantize_transposed";
  expect_on_device(kOp, "x", x);
  const MxQuantizeArgs q = mx_quantize_args(kOp, x, codes, scales, true, Device::kCuda);
  launch_mx_quantize_transposed(q.values, q.x.batch, q.x.rows, q.x.cols, device_elem(q.elem),
                                device_scale_rule(mode), q.codes, q.scales, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_mx_quantize_transposed");
}

void mx_dequantize(const MxOperandView& quantized, TensorView x) {
  constexpr const char* kOp = "mx_dequantize";
  expect_on_device(kOp, "codes", quantized.codes);
  const MxOperandArgs q = mx_operand_args(kOp, "codes", quantized, Device::kCuda);
  expect_mx_shape(kOp, "x", x, quantized.codes.rank(), q.dims, Device::kCuda);
  expect_f32_or_bf16(kOp, "x", x);
  const int64_t n = q.dims.batch * q.dims.rows * q.dims.cols;
  if (x.dtype() == DType::kBf16)
    launch_mx_dequantize_to_bf16(q.operand.codes, q.operand.scales, n, device_elem(q.operand.elem),
                                 bf16_bits(kOp, x), stream());
  else
    launch_mx_dequantize(q.operand.codes, q.operand.scales, n, device_elem(q.operand.elem),
                         x.data<float>(kOp), stream());
  MOE_CUDA_CHECK_LAUNCH(
      kOp, x.dtype() == DType::kBf16 ? "launch_mx_dequantize_to_bf16" : "launch_mx_dequantize");
}

}  // namespace moecore::kernels::cuda
