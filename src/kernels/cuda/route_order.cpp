// The MoE dispatch's send order on the GPU (route_order.cu), its views checked as the CPU backend
// checks them. The expert ids are not: that would read one back and wait, which this operation
// exists to avoid (issue 15 item 3: routing counts and offsets stay on the device); an id out of
// range gets dst_row -1 and no expert's row (kernels/ops.h).
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::cuda {

void order_routes_by_expert(ConstTensorView topk_index, int64_t experts, TensorView dst_row,
                            TensorView expert_offsets) {
  constexpr const char* kOp = "order_routes_by_expert";
  expect_on_device(kOp, "topk_index", topk_index);
  expect_on_device(kOp, "dst_row", dst_row);
  expect_on_device(kOp, "expert_offsets", expert_offsets);
  const int64_t routes =
      expect_route_order_views(kOp, topk_index, experts, dst_row, expert_offsets, Device::kCuda);
  launch_order_routes_by_expert(topk_index.data<int32_t>(kOp), routes, experts,
                                dst_row.data<int32_t>(kOp), expert_offsets.data<int64_t>(kOp),
                                stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_order_routes_by_expert");
}

}  // namespace moecore::kernels::cuda
