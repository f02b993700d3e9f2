// cudasim: bf16 as the device code uses it (cuda_runtime.h says what cudasim is). Conversions
// from fp32 round to nearest even, as cvt.rn.bf16.f32 does, and give the canonical NaN 0x7fff.
#pragma once

#include <bit>
#include <cstdint>

struct __nv_bfloat16 {
  unsigned short __x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<unsigned short>(rounded >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v.__x) << 16);
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) {
  return v.__x;
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) {
  return {v};
}
