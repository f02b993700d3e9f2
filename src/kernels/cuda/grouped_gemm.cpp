// The routed experts' GEMMs, one cuBLASLt GEMM per expert that has rows. In bf16 each fp32 operand
// is rounded to bf16 once for all experts (a bf16 one, as the experts keep theirs, is read as is).
// The offsets arrive in device memory (as the routing wrote them), but a cuBLASLt GEMM per expert
// needs each expert's row count on the host: they are copied back (expert_offsets_on_host.h). The
// device-offset kernels (grouped_gemm_device.h) have no such wait: in bf16 they replace this loop
// in a stream being captured into a CUDA graph (where a host read is impossible), and everywhere
// when the program asks (train.cuda_grouped_gemm = "one_launch"; runtime.h's
// experts_in_one_launch). bench/cuda/gemm.cpp measures both.
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/expert_offsets_on_host.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/grouped_gemm_device.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/grouped_gemm_checks.h"

namespace moecore::kernels::cuda {
namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// An f32 view as the GEMMs read it: itself in fp32, its bf16 rounding (made here) in bf16, or the
// bf16 copy it already is.
class GemmOperand {
 public:
  GemmOperand(const char* op, ConstTensorView v, MatmulPrecision precision)
      : bf16_(precision == MatmulPrecision::kBf16),
        scratch_(bf16_ && v.dtype() == DType::kF32
                     ? static_cast<size_t>(v.numel()) * sizeof(uint16_t)
                     : 0,
                 stream()) {
    if (!bf16_) {
      data_ = v.data<float>(op);
    } else if (v.dtype() == DType::kBf16) {
      data_ = bf16_bits(op, v);
    } else {
      launch_to_bf16(v.data<float>(op), scratch_.as<uint16_t>(), v.numel(), stream());
      MOE_CUDA_CHECK_LAUNCH(op, "launch_to_bf16");
      data_ = scratch_.as<uint16_t>();
    }
  }
  cudaDataType_t type() const { return bf16_ ? CUDA_R_16BF : CUDA_R_32F; }
  // The bf16 bits (bf16 precision only).
  const uint16_t* bf16_data() const { return static_cast<const uint16_t*>(data_); }
  // The operand `elements` values in (a sub-matrix of an expert or of its rows).
  const void* at_element(int64_t elements) const {
    return bf16_ ? static_cast<const void*>(static_cast<const uint16_t*>(data_) + elements)
                 : static_cast<const void*>(static_cast<const float*>(data_) + elements);
  }

 private:
  bool bf16_;
  StreamScratch scratch_;
  const void* data_ = nullptr;
};

}  // namespace

void grouped_gemm_forward(ConstTensorView x, ConstTensorView w, ConstTensorView expert_offsets,
                          TensorView y, MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm";
  expect_weight_dtype(kOp, "w", w, precision);
  expect_activation_dtype(kOp, "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets, Device::kCuda);
  expect_shape(kOp, "y", y, {s.rows, s.out}, Device::kCuda);
  const GemmOperand xs(kOp, x, precision);
  const GemmOperand ws(kOp, w, precision);
  float* yp = y.data<float>(kOp);
  if (precision == MatmulPrecision::kBf16 && experts_in_one_launch()) {
    launch_grouped_gemm_bf16_device_offsets(xs.bf16_data(), ws.bf16_data(),
                                            expert_offsets.data<int64_t>(kOp), s.experts, s.rows,
                                            s.out, s.in, yp, stream());
    MOE_CUDA_CHECK_LAUNCH(kOp, "launch_grouped_gemm_bf16_device_offsets");
    return;
  }
  const std::vector<int64_t> offsets = expert_offsets_on_host(kOp, expert_offsets, s);
  for (int64_t e = 0; e < s.experts; ++e) {
    const int64_t begin = offsets[at(e)];
    const int64_t count = offsets[at(e + 1)] - begin;
    if (count == 0) continue;
    gemm_lt(kOp, false, true, count, s.out, s.in, 1.0f, xs.at_element(begin * s.in),
            ws.at_element(e * s.out * s.in), xs.type(), 0.0f, yp + begin * s.out);
  }
}

void grouped_gemm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                           ConstTensorView expert_offsets, TensorView dx, TensorView dw,
                           MatmulPrecision precision) {
  constexpr const char* kOp = "grouped_gemm_backward";
  expect_weight_dtype(kOp, "w", w, precision);
  expect_activation_dtype(kOp, "dy", dy, precision);
  expect_activation_dtype(kOp, "x", x, precision);
  const GroupedGemmDims s = grouped_gemm_dims(kOp, x, w, expert_offsets, Device::kCuda);
  expect_shape(kOp, "dy", dy, {s.rows, s.out}, Device::kCuda);
  const bool input_grad = dx.raw() != nullptr;
  if (input_grad) expect_shape(kOp, "dx", dx, {s.rows, s.in}, Device::kCuda);
  expect_shape(kOp, "dw", dw, {s.experts, s.out, s.in}, Device::kCuda);
  const GemmOperand dys(kOp, dy, precision);
  const GemmOperand xs(kOp, x, precision);
  // The weight's operand (a bf16 copy of an fp32 weight) only where the input gradient reads it.
  const std::optional<GemmOperand> ws =
      input_grad ? std::optional<GemmOperand>(std::in_place, kOp, w, precision) : std::nullopt;
  float* dxp = input_grad ? dx.data<float>(kOp) : nullptr;
  float* dwp = dw.data<float>(kOp);
  if (precision == MatmulPrecision::kBf16 && experts_in_one_launch()) {
    const int64_t* offsets = expert_offsets.data<int64_t>(kOp);
    if (input_grad)
      launch_grouped_gemm_bf16_device_offsets_input_grad(
          dys.bf16_data(), ws->bf16_data(), offsets, s.experts, s.rows, s.out, s.in, dxp, stream());
    launch_grouped_gemm_bf16_device_offsets_weight_grad(dys.bf16_data(), xs.bf16_data(), offsets,
                                                        s.experts, s.out, s.in, dwp, stream());
    MOE_CUDA_CHECK_LAUNCH(kOp, "launch_grouped_gemm_bf16_device_offsets_input_grad, _weight_grad");
    return;
  }
  const std::vector<int64_t> offsets = expert_offsets_on_host(kOp, expert_offsets, s);
  for (int64_t e = 0; e < s.experts; ++e) {
    const int64_t begin = offsets[at(e)];
    const int64_t count = offsets[at(e + 1)] - begin;
    if (count == 0) continue;
    // dx_e = dy_e w_e; dw_e += dy_e^T x_e.
    if (input_grad)
      gemm_lt(kOp, false, false, count, s.in, s.out, 1.0f, dys.at_element(begin * s.out),
              ws->at_element(e * s.out * s.in), dys.type(), 0.0f, dxp + begin * s.in);
    gemm_lt(kOp, true, false, s.out, s.in, count, 1.0f, dys.at_element(begin * s.out),
            xs.at_element(begin * s.in), dys.type(), 1.0f, dwp + e * s.out * s.in);
  }
}

}  // namespace moecore::kernels::cuda
