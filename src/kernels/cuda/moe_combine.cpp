// The MoE combine on the GPU (moe_combine.cu), checked as the CPU backend checks it. The row
// numbers are device data: their check is queued with the kernels and an out-of-range one is
// reported at the next synchronisation (index_checks.h), so these never wait for the stream.
#include "kernels/combine_checks.h"
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/index_checks.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

// The shapes of the operands the forward and backward share.
CombineShape checked_combine_shape(const char* op, ConstTensorView routed,
                                   ConstTensorView route_row, ConstTensorView weights) {
  expect_on_device(op, "routed", routed);
  expect_on_device(op, "route_row", route_row);
  expect_on_device(op, "weights", weights);
  return combine_shape(op, routed, route_row, weights, Device::kCuda);
}

// Every row number inside routed: checked on the device, reported at the next synchronisation.
// Queued after every host-side check of the call, so that a call refused here leaves nothing
// pending.
void check_route_rows(const char* op, ConstTensorView route_row, const CombineShape& s,
                      int64_t routed_rows) {
  check_indices_inside(op, "route_row", route_row.data<int32_t>(op), s.tokens * s.k, routed_rows);
}

}  // namespace

void moe_combine_forward(ConstTensorView routed, ConstTensorView route_row, ConstTensorView weights,
                         TensorView y) {
  constexpr const char* kOp = "moe_combine";
  const CombineShape s = checked_combine_shape(kOp, routed, route_row, weights);
  expect_shape(kOp, "y", y, {s.tokens, s.d}, Device::kCuda);
  check_route_rows(kOp, route_row, s, routed.size(0));
  launch_moe_combine_forward(routed.data<float>(kOp), routed.size(0), route_row.data<int32_t>(kOp),
                             weights.data<float>(kOp), s.tokens, s.k, s.d, y.data<float>(kOp),
                             stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_moe_combine_forward");
}

void moe_combine_backward(ConstTensorView dy, ConstTensorView routed, ConstTensorView route_row,
                          ConstTensorView weights, TensorView d_routed, TensorView d_weights) {
  constexpr const char* kOp = "moe_combine_backward";
  const CombineShape s = checked_combine_shape(kOp, routed, route_row, weights);
  expect_on_device(kOp, "dy", dy);
  expect_shape(kOp, "dy", dy, {s.tokens, s.d}, Device::kCuda);
  expect_shape(kOp, "d_routed", d_routed, {routed.size(0), s.d}, Device::kCuda);
  expect_shape(kOp, "d_weights", d_weights, {s.tokens, s.k}, Device::kCuda);
  check_route_rows(kOp, route_row, s, routed.size(0));
  launch_moe_combine_backward(dy.data<float>(kOp), routed.data<float>(kOp), routed.size(0),
                              route_row.data<int32_t>(kOp), weights.data<float>(kOp), s.tokens, s.k,
                              s.d, d_routed.data<float>(kOp), d_weights.data<float>(kOp), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_moe_combine_backward");
}

}  // namespace moecore::kernels::cuda
