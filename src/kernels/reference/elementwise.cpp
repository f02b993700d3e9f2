// Elementwise kernels, the plain-loop oracle.
#include "kernels/elementwise_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels::reference {

void add(ConstTensorView a, ConstTensorView b, TensorView out) {
  expect_same_extents("add", "b", b, a);
  expect_same_extents("add", "out", out, a);
  const float* ap = a.data<float>("add");
  const float* bp = b.data<float>("add");
  float* op = out.data<float>("add");
  for (int64_t i = 0; i < a.numel(); ++i) op[i] = ap[i] + bp[i];
}

void scale(ConstTensorView x, float factor, TensorView out) {
  expect_same_extents("scale", "out", out, x);
  const float* xp = x.data<float>("scale");
  float* op = out.data<float>("scale");
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = xp[i] * factor;
}

}  // namespace moecore::kernels::reference
