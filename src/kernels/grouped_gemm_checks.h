// The argument checks of the grouped GEMM, shared by every backend: expert_offsets give the
// experts of w consecutive rows of x's R, from row 0 (shapes only: the dtypes are each op's to
// check). Rows past the last expert's are a static-capacity buffer's unused tail.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct GroupedGemmDims {
  int64_t rows, experts, out, in;
};

// The shapes: w [E, out, in], x [R, in], expert_offsets [E + 1] i64. The offsets' values are
// where the operands are (device memory on a GPU): host_expert_offsets reads and checks them
// where the host may.
inline GroupedGemmDims grouped_gemm_dims(const char* op, ConstTensorView x, ConstTensorView w,
                                         ConstTensorView expert_offsets,
                                         Device device = Device::kCpu) {
  MOE_CHECK(w.rank() == 3, "[{}] w must be [E, out, in], got rank {}", op, w.rank());
  MOE_CHECK(x.rank() == 2, "[{}] x must be [R, in], got rank {}", op, x.rank());
  const int64_t experts = w.size(0), out = w.size(1), in = w.size(2);
  MOE_CHECK(expert_offsets.dtype() == DType::kI64, "[{}] expert_offsets must be i64, got {}", op,
            dtype_name(expert_offsets.dtype()));
  expect_shape(op, "expert_offsets", expert_offsets, {experts + 1}, device);
  expect_shape(op, "x", x, {x.size(0), in}, device);
  expect_shape(op, "w", w, {experts, out, in}, device);
  return {x.size(0), experts, out, in};
}

// The offsets' values, checked: nondecreasing from 0 to at most R.
inline void check_expert_offsets(const char* op, std::span<const int64_t> offsets,
                                 const GroupedGemmDims& dims) {
  MOE_CHECK(offsets[0] == 0, "[{}] expert_offsets[0]={} must be 0", op, offsets[0]);
  for (int64_t e = 0; e < dims.experts; ++e)
    MOE_CHECK(offsets[static_cast<size_t>(e + 1)] >= offsets[static_cast<size_t>(e)],
              "[{}] expert_offsets decrease at expert {}", op, e);
  MOE_CHECK(offsets.back() <= dims.rows, "[{}] expert_offsets end at {}, past the {} rows of x", op,
            offsets.back(), dims.rows);
}

// The offsets as a backend whose views are host memory (the CPU's, the reference's) reads them,
// checked.
inline std::span<const int64_t> host_expert_offsets(const char* op, ConstTensorView expert_offsets,
                                                    const GroupedGemmDims& dims) {
  const std::span<const int64_t> offsets(expert_offsets.data<int64_t>(op),
                                         static_cast<size_t>(dims.experts + 1));
  check_expert_offsets(op, offsets, dims);
  return offsets;
}

}  // namespace moecore::kernels
