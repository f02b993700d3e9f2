// The CUDA backend's check that it is handed device views (kernels/cuda/device_views.h, header
// only, so it runs here without a GPU): an optional operand not given (a default view, an empty
// one) passes it, as the model and the trainer pass them; a host view with data does not. Before,
// a default view (rank 0: one element at null in host memory) was refused, so every CUDA call
// with an absent operand (the route tally without a router bias, the step limits, the AdamW
// coefficients, the normaliser) failed; the per-op harness had moved absent views to the device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "core/tensor_view.h"
#include "kernels/cuda/device_views.h"

namespace moecore {
namespace {

TEST(CudaDeviceViews, AbsentOptionalOperandsPassTheDeviceCheck) {
  EXPECT_NO_THROW(kernels::cuda::expect_on_device("op", "tally", TensorView()));
  EXPECT_NO_THROW(kernels::cuda::expect_on_device("op", "limits", ConstTensorView()));
  std::vector<float> none;
  EXPECT_NO_THROW(kernels::cuda::expect_on_device("op", "empty", view(none.data(), {0})));
}

TEST(CudaDeviceViews, AHostViewWithDataIsRefusedInOneLine) {
  std::vector<double> host(2, 0.0);
  std::string e;
  try {
    kernels::cuda::expect_on_device("step_decision", "limits", view(host.data(), {2}));
  } catch (const Error& error) {
    e = error.what();
  }
  EXPECT_EQ(e, "[step_decision] limits is in host memory: the CUDA backend takes device views");
}

}  // namespace
}  // namespace moecore
