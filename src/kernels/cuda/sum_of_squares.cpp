// Sum of squares on the GPU (sum_of_squares.cu): the total stays on the device.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void sum_of_squares(ConstTensorView values, TensorView total) {
  constexpr const char* kOp = "sum_of_squares";
  const int64_t n = values.numel();
  expect_on_device(kOp, "values", values);
  expect_on_device(kOp, "total", total);
  expect_shape(kOp, "values", values, {n}, Device::kCuda);
  expect_shape(kOp, "total", total, {1}, Device::kCuda);
  const float* v = values.data<float>(kOp);
  double* out = total.data<double>(kOp);
  if (n == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream()));
    return;
  }
  // The block totals, then the total.
  const StreamScratch partials(sizeof(double) * kSumOfSquaresPartials, stream());
  launch_sum_of_squares(v, n, partials.as<double>(), out, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_sum_of_squares");
}

}  // namespace moecore::kernels::cuda
