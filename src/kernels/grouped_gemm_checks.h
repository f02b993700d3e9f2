// The argument checks of the grouped GEMM, shared by every backend: expert_offsets partition the
// R rows of x among the experts of w (shapes only: the dtypes are each op's to check).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct GroupedGemmDims {
  int64_t rows, experts, out, in;
};

inline GroupedGemmDims grouped_gemm_dims(const char* op, ConstTensorView x, ConstTensorView w,
                                         std::span<const int64_t> expert_offsets,
                                         Device device = Device::kCpu) {
  MOE_CHECK(w.rank() == 3, "[{}] w must be [E, out, in], got rank {}", op, w.rank());
  const int64_t experts = w.size(0), out = w.size(1), in = w.size(2);
  MOE_CHECK(static_cast<int64_t>(expert_offsets.size()) == experts + 1,
            "[{}] expert_offsets has {} entries, expected E + 1 = {}", op, expert_offsets.size(),
            experts + 1);
  MOE_CHECK(expert_offsets[0] == 0, "[{}] expert_offsets[0]={} must be 0", op, expert_offsets[0]);
  for (int64_t e = 0; e < experts; ++e)
    MOE_CHECK(expert_offsets[static_cast<size_t>(e + 1)] >= expert_offsets[static_cast<size_t>(e)],
              "[{}] expert_offsets decrease at expert {}", op, e);
  const int64_t rows = expert_offsets[static_cast<size_t>(experts)];
  expect_shape(op, "x", x, {rows, in}, device);
  expect_shape(op, "w", w, {experts, out, in}, device);
  return {rows, experts, out, in};
}

}  // namespace moecore::kernels
