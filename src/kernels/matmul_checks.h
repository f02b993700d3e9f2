// The argument checks of matmul, shared by every backend: 2-D contiguous views whose inner
// dimensions agree; in a bf16 GEMM b (the weight operand) may be a bf16 copy, and a may be an
// activation rounded to bf16 once for several GEMMs.
#pragma once

#include <cstdint>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct MatmulDims {
  int64_t m, n, k;
};

inline MatmulDims matmul_dims(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b,
                              ConstTensorView c, MatmulPrecision precision,
                              Device device = Device::kCpu) {
  constexpr const char* kOp = "matmul";
  expect_weight_dtype(kOp, "b", b, precision);
  expect_activation_dtype(kOp, "a", a, precision);
  MOE_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2,
            "[{}] a, b, c must be matrices, got ranks {}, {}, {}", kOp, a.rank(), b.rank(),
            c.rank());
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  expect_shape(kOp, "a", a, {a.size(0), a.size(1)}, device);
  expect_shape(kOp, "b", b, {trans_b ? n : k, trans_b ? k : n}, device);
  expect_shape(kOp, "c", c, {m, n}, device);
  return {m, n, k};
}

}  // namespace moecore::kernels
