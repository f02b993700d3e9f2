// to_bf16 on the CPU: the bulk conversion of the bf16 GEMM operands (cpu/bf16_convert.h) over a
// flat view.
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/ops.h"
#include "kernels/elementwise_checks.h"

namespace moecore::kernels::cpu {

void to_bf16(ConstTensorView src, TensorView dst) {
  expect_same_extents("to_bf16", "dst", dst, src);
  MOE_CHECK(src.is_contiguous(), "[to_bf16] src must be contiguous");
  // convert_to_bf16 splits rows over the threads, so a flat view goes in as rows of a fixed
  // length plus the remainder.
  constexpr int64_t kRow = 4096;
  const int64_t n = src.numel();
  const float* from = src.data<float>("to_bf16");
  uint16_t* to = bf16_bits("to_bf16", dst);
  const int64_t full_rows = n / kRow;
  cpu::convert_to_bf16(from, full_rows, kRow, kRow, to);
  cpu::convert_to_bf16(from + full_rows * kRow, 1, n - full_rows * kRow, kRow,
                       to + full_rows * kRow);
}

}  // namespace moecore::kernels::cpu
