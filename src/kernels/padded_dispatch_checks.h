// The argument checks of padded_dispatch_plan, shared by every backend.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels {

struct PaddedDispatchDims {
  int64_t tokens, top_k, experts, slots;  // slots: ranks x block_rows
};

// requests [ranks, E] i64, topk_index [N, k] i32, route_order [N * k] i32, expert_starts [E + 1]
// i64 and the maps of kernels/ops.h's PaddedDispatchMaps, on `device`; a shape that fits.
inline PaddedDispatchDims padded_dispatch_dims(
    const char* op, ConstTensorView requests, ConstTensorView topk_index,
    ConstTensorView route_order, ConstTensorView expert_starts, const PaddedDispatchShape& shape,
    const PaddedDispatchMaps& maps, Device device = Device::kCpu) {
  MOE_CHECK(shape.ranks >= 1 && shape.local_experts >= 1 && shape.rank >= 0 &&
                shape.rank < shape.ranks && shape.capacity >= 0 && shape.block_rows >= 0,
            "[{}] rank {} of {} ranks with {} local experts, capacity {} and block_rows {} is not "
            "a shape",
            op, shape.rank, shape.ranks, shape.local_experts, shape.capacity, shape.block_rows);
  MOE_CHECK(topk_index.rank() == 2, "[{}] topk_index must be [N, k], got rank {}", op,
            topk_index.rank());
  const PaddedDispatchDims d{topk_index.size(0), topk_index.size(1),
                             shape.ranks * shape.local_experts, shape.ranks * shape.block_rows};
  const int64_t routes = d.tokens * d.top_k;
  MOE_CHECK(d.top_k >= 1 && routes < (int64_t{1} << 31) && d.slots < (int64_t{1} << 31) &&
                shape.capacity < (int64_t{1} << 31),
            "[{}] {} routes, {} slots and capacity {} must be row numbers of i32", op, routes,
            d.slots, shape.capacity);
  expect_shape(op, "requests", requests, {shape.ranks, d.experts}, device);
  expect_shape(op, "topk_index", topk_index, {d.tokens, d.top_k}, device);
  expect_shape(op, "route_order", route_order, {routes}, device);
  expect_shape(op, "expert_starts", expert_starts, {d.experts + 1}, device);
  expect_shape(op, "slot_of_position", maps.slot_of_position, {routes}, device);
  expect_shape(op, "position_of_slot", maps.position_of_slot, {d.slots}, device);
  expect_shape(op, "token_of_slot", maps.token_of_slot, {d.slots}, device);
  expect_shape(op, "row_of_slot", maps.row_of_slot, {d.slots}, device);
  expect_shape(op, "slot_of_row", maps.slot_of_row, {shape.capacity}, device);
  expect_shape(op, "expert_offsets", maps.expert_offsets, {shape.local_experts + 1}, device);
  expect_shape(op, "dropped", maps.dropped, {1}, device);
  struct Typed {
    const char* name;
    DType dtype, expected;
  };
  for (const Typed& t : {Typed{"requests", requests.dtype(), DType::kI64},
                         Typed{"topk_index", topk_index.dtype(), DType::kI32},
                         Typed{"route_order", route_order.dtype(), DType::kI32},
                         Typed{"expert_starts", expert_starts.dtype(), DType::kI64},
                         Typed{"slot_of_position", maps.slot_of_position.dtype(), DType::kI32},
                         Typed{"position_of_slot", maps.position_of_slot.dtype(), DType::kI32},
                         Typed{"token_of_slot", maps.token_of_slot.dtype(), DType::kI32},
                         Typed{"row_of_slot", maps.row_of_slot.dtype(), DType::kI32},
                         Typed{"slot_of_row", maps.slot_of_row.dtype(), DType::kI32},
                         Typed{"expert_offsets", maps.expert_offsets.dtype(), DType::kI64},
                         Typed{"dropped", maps.dropped.dtype(), DType::kI64}})
    MOE_CHECK(t.dtype == t.expected, "[{}] {} must be {}, got {}", op, t.name,
              dtype_name(t.expected), dtype_name(t.dtype));
  return d;
}

// The requests' values, where the host may read them (the CPU backend, the reference): every
// rank's requests add up to this rank's routes, as the static sizes assume (every rank of the
// group dispatches a micro-batch of the same shape).
inline void check_equal_routes(const char* op, const int64_t* requests, int64_t ranks,
                               int64_t experts, int64_t routes) {
  for (int64_t src = 0; src < ranks; ++src) {
    int64_t sum = 0;
    for (int64_t e = 0; e < experts; ++e) {
      MOE_CHECK(requests[src * experts + e] >= 0, "[{}] requests[{}, {}]={} is negative", op, src,
                e, requests[src * experts + e]);
      sum += requests[src * experts + e];
    }
    MOE_CHECK(sum == routes,
              "[{}] rank {} dispatches {} routes and this rank {}: the padded transport's sizes "
              "need as many on every rank",
              op, src, sum, routes);
  }
}

}  // namespace moecore::kernels
