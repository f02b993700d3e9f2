// The padded all-to-all's index maps on the GPU (padded_dispatch.cu): checked on the host by
// their shapes only (the routing they read is on the device), the keep matrix's scratch ordered
// on the stream.
#include "core/to_size.h"
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/padded_dispatch_checks.h"

namespace moecore::kernels::cuda {

void padded_dispatch_plan(ConstTensorView requests, ConstTensorView topk_index,
                          ConstTensorView route_order, ConstTensorView expert_starts,
                          const PaddedDispatchShape& shape, const PaddedDispatchMaps& maps) {
  constexpr const char* kOp = "padded_dispatch_plan";
  expect_on_device(kOp, "requests", requests);
  expect_on_device(kOp, "topk_index", topk_index);
  expect_on_device(kOp, "route_order", route_order);
  expect_on_device(kOp, "expert_starts", expert_starts);
  const PaddedDispatchDims d = padded_dispatch_dims(kOp, requests, topk_index, route_order,
                                                    expert_starts, shape, maps, Device::kCuda);
  const int64_t keep_values = shape.ranks * d.experts;
  const int64_t values = 2 * keep_values + d.experts + shape.ranks * (shape.local_experts + 1);
  const StreamScratch scratch(to_size(values) * sizeof(int64_t), stream());
  int64_t* base = scratch.as<int64_t>();
  const PaddedDispatchScratch parts{base, base + keep_values, base + 2 * keep_values,
                                    base + 2 * keep_values + d.experts};
  launch_padded_dispatch_plan(
      requests.data<int64_t>(kOp), topk_index.data<int32_t>(kOp), route_order.data<int32_t>(kOp),
      expert_starts.data<int64_t>(kOp), d.tokens, d.top_k, shape, parts,
      maps.slot_of_position.data<int32_t>(kOp), maps.position_of_slot.data<int32_t>(kOp),
      maps.token_of_slot.data<int32_t>(kOp), maps.row_of_slot.data<int32_t>(kOp),
      maps.slot_of_row.data<int32_t>(kOp), maps.expert_offsets.data<int64_t>(kOp),
      maps.dropped.data<int64_t>(kOp), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_padded_dispatch_plan");
}

}  // namespace moecore::kernels::cuda
