// core/bf16.h's float_to_bf16 on the device, on the bits: round to nearest even, overflow to
// +-Inf, and a NaN keeps its sign and top mantissa bits with the quiet bit set.
// (__float2bfloat16_rn rounds every other value the same, but makes every NaN the canonical
// 0x7fff, which the bit-exact checks would see.)
#pragma once

#include <cstdint>

namespace moecore::kernels::cuda {

__device__ inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// An fp32 result written to an output element of either kind: the value, or its bf16 bits.
__device__ inline void store_value(float* out, float value) {
  *out = value;
}
__device__ inline void store_value(uint16_t* out, float value) {
  *out = float_to_bf16_bits(value);
}

}  // namespace moecore::kernels::cuda
