// RoPE on the GPU (rope.cu), in place, checked as the CPU backend checks it.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/rope_checks.h"

namespace moecore::kernels::cuda {

namespace {

void rotate(const char* op, TensorView x, ConstTensorView cos, ConstTensorView sin,
            int64_t first_position, bool inverse) {
  expect_on_device(op, "x", x);
  expect_on_device(op, "cos", cos);
  expect_on_device(op, "sin", sin);
  const RopeDims dims = rope_dims(op, x, cos, sin, first_position, Device::kCuda);
  const int64_t batch = dims.batch, seq = dims.seq, n_heads = dims.heads, half = dims.half;
  float* xp = x.data<float>(op);
  const float* cos_table = cos.data<float>(op);
  const float* sin_table = sin.data<float>(op);
  // Offset only when there are elements: an empty table may have no data to offset from.
  if (x.numel() > 0) {
    cos_table += first_position * half;
    sin_table += first_position * half;
  }
  launch_rope(xp, cos_table, sin_table, batch, seq, n_heads, half, inverse, stream());
  MOE_CUDA_CHECK_LAUNCH(op, "launch_rope");
}

}  // namespace

void rope_forward(TensorView x, ConstTensorView cos, ConstTensorView sin, int64_t first_position) {
  rotate("rope", x, cos, sin, first_position, false);
}

void rope_backward(TensorView dx, ConstTensorView cos, ConstTensorView sin,
                   int64_t first_position) {
  rotate("rope_backward", dx, cos, sin, first_position, true);
}

}  // namespace moecore::kernels::cuda
