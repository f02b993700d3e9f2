// Elementwise kernels on the CPU: contiguous ranges over the OpenMP pool (each element's result
// is one rounding, so the split does not matter).
#include "kernels/cpu/ops.h"
#include "kernels/elementwise_checks.h"

namespace moecore::kernels::cpu {

void add(ConstTensorView a, ConstTensorView b, TensorView out) {
  expect_same_extents("add", "b", b, a);
  expect_same_extents("add", "out", out, a);
  const float* ap = a.data<float>("add");
  const float* bp = b.data<float>("add");
  float* op = out.data<float>("add");
  const int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) op[i] = ap[i] + bp[i];
}

void scale(ConstTensorView x, float factor, TensorView out) {
  expect_same_extents("scale", "out", out, x);
  const float* xp = x.data<float>("scale");
  float* op = out.data<float>("scale");
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) op[i] = xp[i] * factor;
}

}  // namespace moecore::kernels::cpu
