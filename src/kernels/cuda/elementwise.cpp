// Elementwise operations on the GPU (elementwise.cu), checked as every backend checks them.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/elementwise_checks.h"

namespace moecore::kernels::cuda {

void add(ConstTensorView a, ConstTensorView b, TensorView out) {
  expect_on_device("add", "a", a);
  expect_same_extents("add", "b", b, a);
  expect_same_extents("add", "out", out, a);
  launch_add(a.data<float>("add"), b.data<float>("add"), out.data<float>("add"), a.numel(),
             stream());
  MOE_CUDA_CHECK_LAUNCH("add", "launch_add");
}

void scale(ConstTensorView x, float factor, TensorView out) {
  expect_on_device("scale", "x", x);
  expect_same_extents("scale", "out", out, x);
  launch_scale(x.data<float>("scale"), factor, out.data<float>("scale"), x.numel(), stream());
  MOE_CUDA_CHECK_LAUNCH("scale", "launch_scale");
}

void to_bf16(ConstTensorView src, TensorView dst) {
  expect_on_device("to_bf16", "src", src);
  expect_same_extents("to_bf16", "dst", dst, src);
  MOE_CHECK(src.is_contiguous(), "[to_bf16] src must be contiguous");
  launch_to_bf16(src.data<float>("to_bf16"), bf16_bits("to_bf16", dst), src.numel(), stream());
  MOE_CUDA_CHECK_LAUNCH("to_bf16", "launch_to_bf16");
}

}  // namespace moecore::kernels::cuda
