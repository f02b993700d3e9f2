// to_bf16, the plain-loop oracle: core/bf16.h's rounding element by element.
#include "core/bf16.h"
#include "kernels/elementwise_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels::reference {

void to_bf16(ConstTensorView src, TensorView dst) {
  expect_same_extents("to_bf16", "dst", dst, src);
  MOE_CHECK(src.is_contiguous(), "[to_bf16] src must be contiguous");
  const float* from = src.data<float>("to_bf16");
  uint16_t* to = bf16_bits("to_bf16", dst);
  for (int64_t i = 0; i < src.numel(); ++i) to[i] = float_to_bf16(from[i]);
}

}  // namespace moecore::kernels::reference
