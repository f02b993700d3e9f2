// The scalar rules of MX quantisation on the device (*.cu only): they mirror core/mx_types.cpp
// line by line (format_of, decode_with, encode_with, decode_e8m0, block_scale_code and quantize's
// block loop), so that every code, scale and dequantised value has the CPU's bits. Two library
// calls are spelled out exactly: std::ldexp(1.0f, n) of a power of two is built from its bits
// (exp2_exact), and std::frexp from the exponent field (subnormals normalised first). Every
// product is __fmul_rn, so that no contraction into an fma (nvcc's default -fmad=true) can change
// a rounding; nearbyint is rintf (round to nearest, ties to even, as the default rounding mode).
// Relies on nvcc's default -ftz=false: fp32 subnormals are values here, as on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda::mx_device {

inline constexpr int kBlock = 32;  // mx::kMxBlock
inline constexpr uint32_t kE8m0Nan = 255;
inline constexpr int kE8m0Bias = 127;

// core/mx_types.cpp's ElemFormat, as compile-time constants of each element type.
template <MxElem kElem>
struct Format;
template <>
struct Format<MxElem::kE4M3> {
  static constexpr int mantissa_bits = 3, bias = 7, emax = 8;
  static constexpr bool has_inf = false;
  static constexpr uint32_t max_code = 0x7e;
};
template <>
struct Format<MxElem::kE5M2> {
  static constexpr int mantissa_bits = 2, bias = 15, emax = 15;
  static constexpr bool has_inf = true;
  static constexpr uint32_t max_code = 0x7b;
};

// std::ldexp(1.0f, n) for n in [-149, 127]: the normal power of two from its exponent field, the
// subnormal one (n < -126) from its single mantissa bit. Exact.
__device__ inline float exp2_exact(int n) {
  return n >= -126 ? __uint_as_float(static_cast<uint32_t>(n + 127) << 23)
                   : __uint_as_float(1u << (n + 149));
}

__device__ inline float quiet_nan() {
  return __uint_as_float(0x7fc00000u);  // std::numeric_limits<float>::quiet_NaN()
}

// decode_with: the exact value of a code (the sign applied to the bits, so -0 and NaN keep it).
template <MxElem kElem>
__device__ inline float decode_elem(uint8_t code) {
  using F = Format<kElem>;
  constexpr int mb = F::mantissa_bits;
  const int magnitude = code & 0x7f;
  const int exponent = magnitude >> mb;
  const int mantissa = magnitude & ((1 << mb) - 1);
  constexpr int exponent_all_ones = (1 << (7 - mb)) - 1;
  float value;
  if (F::has_inf && exponent == exponent_all_ones) {
    value = mantissa == 0 ? __uint_as_float(0x7f800000u) : quiet_nan();
  } else if (!F::has_inf && magnitude == 0x7f) {
    value = quiet_nan();
  } else if (exponent == 0) {  // subnormal: mantissa * 2^(1 - bias - mb)
    value = __fmul_rn(static_cast<float>(mantissa), exp2_exact(1 - F::bias - mb));
  } else {
    value =
        __fmul_rn(static_cast<float>((1 << mb) + mantissa), exp2_exact(exponent - F::bias - mb));
  }
  return (code & 0x80) != 0 ? __uint_as_float(__float_as_uint(value) | 0x80000000u) : value;
}

// encode_with: round to nearest even, saturate to +-max, NaN to sign | 0x7f.
template <MxElem kElem>
__device__ inline uint8_t encode_elem(float value) {
  using F = Format<kElem>;
  const uint32_t bits = __float_as_uint(value);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;  // NaN, as PyTorch encodes it for both types
  constexpr int mb = F::mantissa_bits;
  const float magnitude = __uint_as_float(abs_bits);
  uint32_t code;
  if (magnitude < exp2_exact(1 - F::bias)) {
    // Below the smallest normal the codes are the multiples of 2^(1 - bias - mb): the scaling by
    // the inverse power of two is exact, rintf rounds ties to even.
    code = static_cast<uint32_t>(rintf(__fmul_rn(magnitude, exp2_exact(F::bias - 1 + mb))));
  } else {
    // The fp32 mantissa rounded to mb bits, ties to even (a carry moves into the exponent), the
    // exponent field rebiased from 127 to bias; infinity too, saturated by the clamp below.
    constexpr int shift = 23 - mb;
    constexpr uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
    const uint32_t rounded = (abs_bits + half_minus_one + ((abs_bits >> shift) & 1u)) >> shift;
    code = rounded - (static_cast<uint32_t>(127 - F::bias) << mb);
  }
  return sign | static_cast<uint8_t>(code < F::max_code ? code : F::max_code);
}

// decode_e8m0: 2^(code - 127), NaN for 255.
__device__ inline float decode_e8m0(uint8_t code) {
  if (code == kE8m0Nan) return quiet_nan();
  return exp2_exact(static_cast<int>(code) - kE8m0Bias);
}

// block_scale_code: the E8M0 code of a block whose largest magnitude is amax (NaN: 255).
template <MxElem kElem>
__device__ inline uint8_t block_scale_code(MxScaleRule rule, float amax) {
  using F = Format<kElem>;
  if (isnan(amax)) return static_cast<uint8_t>(kE8m0Nan);
  amax = fabsf(amax);
  int exponent;  // log2 of the scale
  if (rule == MxScaleRule::kFloor) {
    // floor(log2 amax) as the exponent field says it (fp32 subnormals read as -127, Inf as 128).
    exponent = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu) - 127 - F::emax;
  } else {
    if (isinf(amax)) return static_cast<uint8_t>(kE8m0Nan - 1);  // satfinite: 2^127
    if (amax == 0.0f) return 0;                                  // rounds up to the smallest scale
    // frexp: amax = frac * 2^e, frac in [1/2, 1), i.e. 2 frac = 1.mantissa and e - 1 = the
    // unbiased exponent, a subnormal's normalised first. The CPU's test 2 frac > m, m =
    // max_elem / 2^emax = 1.(max_code's mantissa), is exact, and so is the same test on the
    // mantissa fields: fraction bits > max_code's mantissa bits placed at fp32's top.
    uint32_t field = (__float_as_uint(amax) >> 23) & 0xffu;
    uint32_t fraction = __float_as_uint(amax) & 0x7fffffu;
    int e_minus_1;
    if (field == 0) {  // subnormal: shift the leading one into bit 23
      const int shift = __clz(static_cast<int>(fraction)) - 8;
      fraction = (fraction << shift) & 0x7fffffu;
      e_minus_1 = 1 - shift - 127;
    } else {
      e_minus_1 = static_cast<int>(field) - 127;
    }
    constexpr uint32_t m_fraction = (F::max_code & ((1u << F::mantissa_bits) - 1u))
                                    << (23 - F::mantissa_bits);
    exponent = e_minus_1 - F::emax + (fraction > m_fraction ? 1 : 0);
  }
  exponent = exponent < -kE8m0Bias ? -kE8m0Bias : (exponent > kE8m0Bias ? kE8m0Bias : exponent);
  return static_cast<uint8_t>(exponent + kE8m0Bias);
}

// quantize's block: values v[0], v[stride], ... v[31 stride] -> 32 consecutive codes and one
// scale: amax (NaN when the block holds one), its scale code, and each element encoded after one
// fp32 multiply by 1 / X = 2^(127 - code) (2^127 .. 2^-128, code 255 read as 2^128), exact.
template <MxElem kElem>
__device__ inline void quantize_block(MxScaleRule rule, const float* v, int64_t stride,
                                      uint8_t* codes, uint8_t* scale) {
  float values[kBlock];  // in registers: every loop over it is unrolled
#pragma unroll
  for (int i = 0; i < kBlock; ++i) values[i] = v[i * stride];
  float amax = 0.0f;
  bool has_nan = false;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    const float a = fabsf(values[i]);
    has_nan = has_nan || isnan(a);
    amax = a > amax ? a : amax;
  }
  const uint8_t code = block_scale_code<kElem>(rule, has_nan ? quiet_nan() : amax);
  *scale = code;
  const float inverse_scale = exp2_exact(kE8m0Bias - static_cast<int>(code));
#pragma unroll
  for (int i = 0; i < kBlock; ++i)
    codes[i] = encode_elem<kElem>(__fmul_rn(values[i], inverse_scale));
}

// One dequantised value: decode(code) * decode_e8m0(scale), one rounding.
template <MxElem kElem>
__device__ inline float dequantize_elem(uint8_t code, uint8_t scale) {
  return __fmul_rn(decode_elem<kElem>(code), decode_e8m0(scale));
}

}  // namespace moecore::kernels::cuda::mx_device
