// The oracles' view of a GEMM operand (a weight, or an activation kept in bf16): its values as
// fp32, whether it holds f32 or bf16 bits (a bf16 copy reads as the exact fp32 values of its
// bits). A copy, which an oracle can afford. And the other way: an oracle's output written as its
// view holds it.
#pragma once

#include <cstddef>
#include <vector>

#include "core/bf16.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

// out[i] = value as out's dtype holds it: f32, or float_to_bf16's bits (a bf16 output).
inline void store_output(const char* op, TensorView out, int64_t i, float value) {
  if (out.dtype() == DType::kBf16)
    bf16_bits(op, out)[i] = float_to_bf16(value);
  else
    out.data<float>(op)[i] = value;
}

inline std::vector<float> weight_values(const char* op, ConstTensorView w) {
  const size_t n = static_cast<size_t>(w.numel());
  if (w.dtype() != DType::kBf16) {
    const float* values = w.data<float>(op);
    return {values, values + n};
  }
  const uint16_t* bits = bf16_bits(op, w);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

}  // namespace moecore::kernels::reference
