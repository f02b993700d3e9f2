// SwiGLU on the GPU (swiglu.cu), checked as the CPU backend checks it.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void swiglu_forward(ConstTensorView gu, TensorView act) {
  constexpr const char* kOp = "swiglu";
  expect_on_device(kOp, "gu", gu);
  MOE_CHECK(act.rank() == 2, "[{}] act must be [rows, hidden], got rank {}", kOp, act.rank());
  const int64_t rows = act.size(0), hidden = act.size(1);
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden}, Device::kCuda);
  expect_shape(kOp, "act", act, {rows, hidden}, Device::kCuda);
  expect_f32_or_bf16(kOp, "act", act);
  if (act.dtype() == DType::kBf16)
    launch_swiglu_forward(gu.data<float>(kOp), bf16_bits(kOp, act), rows, hidden, stream());
  else
    launch_swiglu_forward(gu.data<float>(kOp), act.data<float>(kOp), rows, hidden, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_swiglu_forward");
}

void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  constexpr const char* kOp = "swiglu_backward";
  expect_on_device(kOp, "dact", dact);
  expect_on_device(kOp, "gu", gu);
  MOE_CHECK(dact.rank() == 2, "[{}] dact must be [rows, hidden], got rank {}", kOp, dact.rank());
  const int64_t rows = dact.size(0), hidden = dact.size(1);
  expect_shape(kOp, "dact", dact, {rows, hidden}, Device::kCuda);
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden}, Device::kCuda);
  expect_shape(kOp, "dgu", dgu, {rows, 2 * hidden}, Device::kCuda);
  expect_f32_or_bf16(kOp, "dgu", dgu);
  if (dgu.dtype() == DType::kBf16)
    launch_swiglu_backward(dact.data<float>(kOp), gu.data<float>(kOp), bf16_bits(kOp, dgu), rows,
                           hidden, stream());
  else
    launch_swiglu_backward(dact.data<float>(kOp), gu.data<float>(kOp), dgu.data<float>(kOp), rows,
                           hidden, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_swiglu_backward");
}

}  // namespace moecore::kernels::cuda
