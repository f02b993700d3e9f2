#include "core/mx_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace moecore::mx {
namespace {

// An FP8 element format: 1 sign bit, 7 - mantissa_bits exponent bits, mantissa_bits mantissa bits.
struct ElemFormat {
  int mantissa_bits;
  int bias;
  bool has_inf;      // E5M2 keeps IEEE infinities; E4M3 spends that exponent on finite values
  uint8_t max_code;  // the code of the largest finite magnitude
  int emax;          // its exponent (448 = 1.75 * 2^8, 57344 = 1.75 * 2^15)
};

constexpr ElemFormat kE4M3Format{3, 7, false, 0x7e, 8};
constexpr ElemFormat kE5M2Format{2, 15, true, 0x7b, 15};

const ElemFormat& format_of(ElemType type) {
  return type == ElemType::kE4M3 ? kE4M3Format : kE5M2Format;
}

float decode_with(const ElemFormat& f, uint8_t code) {
  const int mb = f.mantissa_bits;
  const int magnitude = code & 0x7f;
  const int exponent = magnitude >> mb;
  const int mantissa = magnitude & ((1 << mb) - 1);
  const int exponent_all_ones = (1 << (7 - mb)) - 1;
  float value;
  if (f.has_inf && exponent == exponent_all_ones) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else if (!f.has_inf && magnitude == 0x7f) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {  // subnormal: mantissa * 2^(1 - bias - mb)
    value = std::ldexp(static_cast<float>(mantissa), 1 - f.bias - mb);
  } else {
    value = std::ldexp(static_cast<float>((1 << mb) + mantissa), exponent - f.bias - mb);
  }
  return (code & 0x80) != 0 ? -value : value;
}

uint8_t encode_with(const ElemFormat& f, float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;  // NaN, as PyTorch encodes it for both types
  const int mb = f.mantissa_bits;
  const float magnitude = std::bit_cast<float>(abs_bits);
  uint32_t code;
  if (magnitude < std::ldexp(1.0f, 1 - f.bias)) {
    // Below the smallest normal the codes are the multiples of 2^(1 - bias - mb): scaling by the
    // inverse power of two is exact, and nearbyint rounds ties to even (default rounding mode).
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(magnitude, f.bias - 1 + mb)));
  } else {
    // Round the fp32 mantissa to mb bits, ties to even (a carry moves into the exponent), then
    // rebias the exponent field from 127 to f.bias. Infinity takes this path too; the clamp below
    // saturates it.
    const int shift = 23 - mb;
    const uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
    const uint32_t rounded = (abs_bits + half_minus_one + ((abs_bits >> shift) & 1u)) >> shift;
    code = rounded - (static_cast<uint32_t>(127 - f.bias) << mb);
  }
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, f.max_code));
}

std::array<float, 256> decode_table(const ElemFormat& f) {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = decode_with(f, static_cast<uint8_t>(code));
  return table;
}

}  // namespace

std::string_view elem_type_name(ElemType type) {
  return type == ElemType::kE4M3 ? "e4m3" : "e5m2";
}

std::string_view scale_mode_name(ScaleMode mode) {
  return mode == ScaleMode::kRceil ? "rceil" : "floor";
}

ElemType parse_elem_type(std::string_view text, std::string_view what) {
  if (text == "e4m3") return ElemType::kE4M3;
  if (text == "e5m2") return ElemType::kE5M2;
  fail("[mx] {}: unknown element type '{}' (expected e4m3 or e5m2)", what, text);
}

ScaleMode parse_scale_mode(std::string_view text, std::string_view what) {
  if (text == "rceil") return ScaleMode::kRceil;
  if (text == "floor") return ScaleMode::kFloor;
  fail("[mx] {}: unknown scale mode '{}' (expected rceil or floor)", what, text);
}

int elem_emax(ElemType type) {
  return format_of(type).emax;
}

float elem_max(ElemType type) {
  return decode_with(format_of(type), format_of(type).max_code);
}

float decode_elem(ElemType type, uint8_t code) {
  return elem_decode_table(type)[code];
}

uint8_t encode_elem(ElemType type, float value) {
  return encode_with(format_of(type), value);
}

const float* elem_decode_table(ElemType type) {
  static const std::array<float, 256> e4m3 = decode_table(kE4M3Format);
  static const std::array<float, 256> e5m2 = decode_table(kE5M2Format);
  return type == ElemType::kE4M3 ? e4m3.data() : e5m2.data();
}

float decode_e8m0(uint8_t code) {
  if (code == kE8m0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - kE8m0Bias);
}

uint8_t block_scale_code(ElemType type, ScaleMode mode, float amax) {
  if (std::isnan(amax)) return kE8m0Nan;
  amax = std::fabs(amax);
  const int emax = elem_emax(type);
  int exponent;  // log2 of the scale
  if (mode == ScaleMode::kFloor) {
    // floor(log2 amax) as the exponent field says it (fp32 subnormals read as -127, Inf as 128).
    exponent = static_cast<int>((std::bit_cast<uint32_t>(amax) >> 23) & 0xffu) - 127 - emax;
  } else {
    if (std::isinf(amax)) return kE8m0Nan - 1;  // satfinite: the largest finite scale, 2^127
    if (amax == 0.0f) return 0;                 // rounds up to the smallest scale
    // amax = frac * 2^e with frac in [1/2, 1), so amax / max_elem = (2 frac / m) * 2^(e-1-emax)
    // where m = max_elem / 2^emax = 1.75. Both 2 frac and m lie in [1, 2), so the leading factor
    // lies in (1/2, 2): the power of two at or above the ratio is 2^(e-1-emax) when 2 frac <= m and
    // twice that otherwise. Exact: no division is rounded.
    int e = 0;
    const float frac = std::frexp(amax, &e);
    const float m = std::ldexp(elem_max(type), -emax);
    exponent = e - 1 - emax + (2.0f * frac > m ? 1 : 0);
  }
  return static_cast<uint8_t>(std::clamp(exponent, -kE8m0Bias, kE8m0Bias) + kE8m0Bias);
}

void check_mx_contraction(std::string_view op, int64_t k) {
  MOE_CHECK(k > 0 && k % kMxBlock == 0,
            "[{}] contraction dimension k={} is not a positive multiple of the MX block size {}: "
            "mxfp8 cannot run on it",
            op, k, kMxBlock);
}

void quantize(ElemType type, ScaleMode mode, int64_t rows, int64_t cols, const float* x,
              int64_t ldx, uint8_t* codes, uint8_t* scales) {
  check_mx_contraction("mx quantize", cols);
  MOE_CHECK(rows >= 0 && ldx >= cols, "[mx quantize] bad shape rows={} cols={} ldx={}", rows, cols,
            ldx);
  const ElemFormat& format = format_of(type);
  const int64_t blocks = cols / kMxBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * ldx + b * kMxBlock;
      float amax = 0.0f;
      bool has_nan = false;
      for (int64_t i = 0; i < kMxBlock; ++i) {
        const float a = std::fabs(v[i]);
        has_nan = has_nan || std::isnan(a);
        amax = a > amax ? a : amax;
      }
      const uint8_t scale =
          block_scale_code(type, mode, has_nan ? std::numeric_limits<float>::quiet_NaN() : amax);
      scales[r * blocks + b] = scale;
      // 1 / X = 2^(127 - code): 2^127 .. 2^-128 (code 255 read as 2^128), all exact in fp32.
      const float inverse_scale = std::ldexp(1.0f, kE8m0Bias - static_cast<int>(scale));
      uint8_t* out = codes + r * cols + b * kMxBlock;
      for (int64_t i = 0; i < kMxBlock; ++i) out[i] = encode_with(format, v[i] * inverse_scale);
    }
  }
}

void dequantize(ElemType type, int64_t rows, int64_t cols, const uint8_t* codes,
                const uint8_t* scales, float* x) {
  check_mx_contraction("mx dequantize", cols);
  MOE_CHECK(rows >= 0, "[mx dequantize] bad shape rows={}", rows);
  const float* table = elem_decode_table(type);
  const int64_t blocks = cols / kMxBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      x[r * cols + c] = table[codes[r * cols + c]] * decode_e8m0(scales[r * blocks + c / kMxBlock]);
    }
  }
}

}  // namespace moecore::mx
