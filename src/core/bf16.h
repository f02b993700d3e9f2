// bfloat16: the top 16 bits of an IEEE fp32 value (8-bit exponent, 7-bit mantissa). Conversion
// rounds to nearest, ties to even (as PyTorch's .to(torch.bfloat16) and oneDNN's reorders do);
// NaN stays NaN (quieted), and +-Inf and values that round past the largest bf16 become +-Inf.
#pragma once

#include <bit>
#include <cstdint>

namespace moecore {

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // NaN: keep the sign and the top mantissa bits, force the quiet bit so it cannot become Inf.
  // A select rather than an early return, so that loops over this vectorise.
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float bf16_to_float(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

// The fp32 value nearest to `value` that bf16 can represent exactly.
inline float round_to_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

// An fp32 result written to an output element of either kind: the value, or its bf16 bits (for
// kernels whose output may be bf16 where only bf16 GEMMs read it).
inline void store_value(float* out, float value) {
  *out = value;
}
inline void store_value(uint16_t* out, float value) {
  *out = float_to_bf16(value);
}

}  // namespace moecore
