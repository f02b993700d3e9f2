// The argument checks of the MoE combine, shared by every backend: shapes only (each backend
// checks the row numbers where they are: in host or in device memory).
#pragma once

#include <cstdint>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct CombineShape {
  int64_t tokens, k, d;
};

inline CombineShape combine_shape(const char* op, ConstTensorView routed, ConstTensorView route_row,
                                  ConstTensorView weights, Device device = Device::kCpu) {
  MOE_CHECK(route_row.rank() == 2 && routed.rank() == 2,
            "[{}] route_row must be [N, k] and routed [rows, d], got ranks {} and {}", op,
            route_row.rank(), routed.rank());
  const CombineShape s{route_row.size(0), route_row.size(1), routed.size(1)};
  expect_shape(op, "weights", weights, {s.tokens, s.k}, device);
  expect_shape(op, "route_row", route_row, {s.tokens, s.k}, device);
  expect_shape(op, "routed", routed, {routed.size(0), s.d}, device);
  return s;
}

}  // namespace moecore::kernels
