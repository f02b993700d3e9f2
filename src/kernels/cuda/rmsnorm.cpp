// RMSNorm on the GPU (rmsnorm.cu), checked as the CPU backend checks it.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void rmsnorm_forward(ConstTensorView x, ConstTensorView w, TensorView y, TensorView rstd,
                     float eps) {
  constexpr const char* kOp = "rmsnorm";
  expect_on_device(kOp, "x", x);
  expect_on_device(kOp, "w", w);
  MOE_CHECK(x.rank() == 2, "[{}] x must be [rows, dim], got rank {}", kOp, x.rank());
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape(kOp, "x", x, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "w", w, {dim}, Device::kCuda);
  expect_shape(kOp, "y", y, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "rstd", rstd, {rows}, Device::kCuda);
  launch_rmsnorm_forward(x.data<float>(kOp), w.data<float>(kOp), y.data<float>(kOp),
                         rstd.data<float>(kOp), rows, dim, eps, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_rmsnorm_forward");
}

void rmsnorm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                      ConstTensorView rstd, TensorView dx, TensorView dw, bool accumulate_dx) {
  constexpr const char* kOp = "rmsnorm_backward";
  expect_on_device(kOp, "dy", dy);
  expect_on_device(kOp, "x", x);
  expect_on_device(kOp, "w", w);
  expect_on_device(kOp, "rstd", rstd);
  MOE_CHECK(x.rank() == 2, "[{}] x must be [rows, dim], got rank {}", kOp, x.rank());
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape(kOp, "dy", dy, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "x", x, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "w", w, {dim}, Device::kCuda);
  expect_shape(kOp, "rstd", rstd, {rows}, Device::kCuda);
  expect_shape(kOp, "dx", dx, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "dw", dw, {dim}, Device::kCuda);
  // dw's partial sums per row chunk, summed in chunk order by the launcher's last kernel.
  const StreamScratch scratch(
      static_cast<size_t>(rmsnorm_backward_scratch_floats(rows, dim)) * sizeof(float), stream());
  launch_rmsnorm_backward(dy.data<float>(kOp), x.data<float>(kOp), w.data<float>(kOp),
                          rstd.data<float>(kOp), dx.data<float>(kOp), dw.data<float>(kOp),
                          scratch.as<float>(), rows, dim, accumulate_dx, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_rmsnorm_backward");
}

}  // namespace moecore::kernels::cuda
