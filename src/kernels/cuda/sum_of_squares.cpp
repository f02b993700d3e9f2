// Sum of squares on the GPU (sum_of_squares.cu): the total comes back to the host, so this waits.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

double sum_of_squares(ConstTensorView values) {
  constexpr const char* kOp = "sum_of_squares";
  const int64_t n = values.numel();
  expect_on_device(kOp, "values", values);
  expect_shape(kOp, "values", values, {n}, Device::kCuda);
  const float* v = values.data<float>(kOp);
  if (n == 0) return 0.0;
  // The block totals, then the total.
  const StreamScratch scratch(sizeof(double) * (kSumOfSquaresPartials + 1), stream());
  double* partials = scratch.as<double>();
  double* device_total = partials + kSumOfSquaresPartials;
  launch_sum_of_squares(v, n, partials, device_total, stream());
  MOE_CUDA_CHECK(cudaGetLastError());
  double total = 0.0;
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(&total, device_total, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  synchronize();
  return total;
}

}  // namespace moecore::kernels::cuda
