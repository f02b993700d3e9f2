// MX element and scale codecs and block quantisation (core/mx_types.h), checked against plain
// definitions evaluated in fp64 (every FP8 value, every power of two of E8M0 and every quotient
// x / 2^e is exact in fp64): the nearest code by exhaustive search with ties to the even code,
// the smallest power of two that fits amax, and fixed values from the OCP MX / OFP8 tables.
// The bit-level conformance against ml_dtypes and torchao is
// tests/reference/test_mx_conformance.py.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/mx_types.h"

namespace moecore::mx {
namespace {

constexpr ElemType kTypes[] = {ElemType::kE4M3, ElemType::kE5M2};
constexpr ScaleMode kModes[] = {ScaleMode::kRceil, ScaleMode::kFloor};

uint8_t max_code(ElemType type) {
  return type == ElemType::kE4M3 ? 0x7e : 0x7b;
}

// RNE with saturation by definition: the finite non-negative code nearest to |v|, ties to the
// even code (adjacent values have adjacent codes, so exactly one of two neighbours is even),
// beyond the largest finite value the largest; the sign bit from v.
uint8_t nearest_code(ElemType type, double v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return sign | 0x7f;
  const double a = std::fabs(v);
  if (a >= static_cast<double>(elem_max(type))) return sign | max_code(type);
  int best = 0;
  double best_dist = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= max_code(type); ++code) {
    const double dist =
        std::fabs(a - static_cast<double>(decode_elem(type, static_cast<uint8_t>(code))));
    if (dist < best_dist || (dist == best_dist && code % 2 == 0)) {
      best = code;
      best_dist = dist;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

// rceil by definition: the smallest code c with amax <= max_elem * 2^(c - 127), clamped to 254.
uint8_t rceil_by_search(ElemType type, float amax) {
  for (int code = 0; code <= 254; ++code) {
    if (static_cast<double>(amax) <= std::ldexp(static_cast<double>(elem_max(type)), code - 127)) {
      return static_cast<uint8_t>(code);
    }
  }
  return 254;
}

// A float with a random sign, mantissa and exponent in [lo, hi] (fp32 subnormals when lo < -126).
float random_float(std::mt19937& gen, int lo, int hi) {
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  const float v = std::ldexp(mantissa(gen), exponent(gen));
  return negative(gen) ? -v : v;
}

TEST(MxTypes, DecodeMatchesTheOcpTables) {
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x00), 0.0f);
  EXPECT_TRUE(std::signbit(decode_elem(ElemType::kE4M3, 0x80)));
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x38), 1.0f);
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x7e), 448.0f);
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(decode_elem(ElemType::kE4M3, 0x7f)));
  EXPECT_TRUE(std::isnan(decode_elem(ElemType::kE4M3, 0xff)));
  EXPECT_EQ(decode_elem(ElemType::kE4M3, 0x77), 240.0f);  // S.1110.111 is finite in E4M3

  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0x3c), 1.0f);
  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0x7b), 57344.0f);
  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(decode_elem(ElemType::kE5M2, 0xfc), -std::numeric_limits<float>::infinity());
  for (const int code : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) {
    EXPECT_TRUE(std::isnan(decode_elem(ElemType::kE5M2, static_cast<uint8_t>(code)))) << code;
  }
  EXPECT_EQ(elem_max(ElemType::kE4M3), 448.0f);
  EXPECT_EQ(elem_max(ElemType::kE5M2), 57344.0f);
  EXPECT_EQ(elem_emax(ElemType::kE4M3), 8);
  EXPECT_EQ(elem_emax(ElemType::kE5M2), 15);
}

TEST(MxTypes, AllCodesRoundTrip) {
  for (const ElemType type : kTypes) {
    for (int code = 0; code < 256; ++code) {
      const auto c = static_cast<uint8_t>(code);
      const float v = decode_elem(type, c);
      if (std::isnan(v)) {
        // Every NaN code encodes back to the canonical NaN of its sign.
        EXPECT_EQ(encode_elem(type, v), (c & 0x80) | 0x7f) << elem_type_name(type) << " " << code;
      } else if (std::isinf(v)) {
        // E5M2's infinities saturate to +-57344: the satfinite conversion.
        EXPECT_EQ(encode_elem(type, v), (c & 0x80) | 0x7b) << code;
      } else {
        EXPECT_EQ(encode_elem(type, v), c) << elem_type_name(type) << " " << code;
      }
    }
  }
}

TEST(MxTypes, EncodeRoundsToNearestEvenAndSaturates) {
  const ElemType e4m3 = ElemType::kE4M3;
  EXPECT_EQ(encode_elem(e4m3, 1.0625f), 0x38);  // halfway 1 | 1.125: even mantissa 000
  EXPECT_EQ(encode_elem(e4m3, 1.1875f), 0x3a);  // halfway 1.125 | 1.25: even mantissa 010
  EXPECT_EQ(encode_elem(e4m3, std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(encode_elem(e4m3, std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal
  EXPECT_EQ(encode_elem(e4m3, -std::ldexp(1.0f, -10)), 0x80);  // keeps the sign
  EXPECT_EQ(encode_elem(e4m3, std::ldexp(3.0f, -10)), 0x02);   // 1.5 quanta: even 2
  EXPECT_EQ(encode_elem(e4m3, std::ldexp(15.0f, -10)), 0x08);  // 7.5 quanta: up to 2^-6
  EXPECT_EQ(encode_elem(e4m3, 464.0f), 0x7e);                  // halfway 448 | (480): 448
  EXPECT_EQ(encode_elem(e4m3, 1e30f), 0x7e);
  EXPECT_EQ(encode_elem(e4m3, std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(encode_elem(e4m3, -std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(encode_elem(e4m3, std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(encode_elem(e4m3, -std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(encode_elem(e4m3, std::numeric_limits<float>::denorm_min()), 0x00);
  const ElemType e5m2 = ElemType::kE5M2;
  EXPECT_EQ(encode_elem(e5m2, 1.125f), 0x3c);    // halfway 1 | 1.25: even
  EXPECT_EQ(encode_elem(e5m2, 1.375f), 0x3e);    // halfway 1.25 | 1.5: even
  EXPECT_EQ(encode_elem(e5m2, 61440.0f), 0x7b);  // halfway 57344 | (65536): saturates
  EXPECT_EQ(encode_elem(e5m2, std::numeric_limits<float>::infinity()), 0x7b);
  EXPECT_EQ(encode_elem(e5m2, std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(MxTypes, EncodeEqualsExhaustiveNearestCode) {
  std::mt19937 gen(7);
  for (const ElemType type : kTypes) {
    for (int trial = 0; trial < 20000; ++trial) {
      const float v = random_float(gen, -30, 20);
      ASSERT_EQ(encode_elem(type, v), nearest_code(type, v)) << elem_type_name(type) << " " << v;
    }
    // Every midpoint between neighbours and the floats around it.
    for (int code = 0; code < max_code(type); ++code) {
      const float lo = decode_elem(type, static_cast<uint8_t>(code));
      const float hi = decode_elem(type, static_cast<uint8_t>(code + 1));
      const float mid = lo + (hi - lo) / 2;  // exact: both have few significant bits
      for (const float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
        ASSERT_EQ(encode_elem(type, v), nearest_code(type, v)) << elem_type_name(type) << " " << v;
        ASSERT_EQ(encode_elem(type, -v), nearest_code(type, -v)) << elem_type_name(type);
      }
    }
  }
}

TEST(MxTypes, E8m0) {
  EXPECT_EQ(decode_e8m0(0), std::ldexp(1.0f, -127));  // an fp32 subnormal, exactly
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(decode_e8m0(kE8m0Nan)));
  for (int code = 0; code < 255; ++code) {
    EXPECT_EQ(decode_e8m0(static_cast<uint8_t>(code)), std::ldexp(1.0f, code - 127));
  }
}

TEST(MxTypes, ScaleRulesAtTheirBoundaries) {
  const ElemType e4m3 = ElemType::kE4M3;
  const auto rceil = [&](float amax) { return block_scale_code(e4m3, ScaleMode::kRceil, amax); };
  const auto floor = [&](float amax) { return block_scale_code(e4m3, ScaleMode::kFloor, amax); };
  EXPECT_EQ(rceil(448.0f), 127);  // 448 / 448 = 1 is a power of two: not rounded up
  EXPECT_EQ(rceil(std::nextafter(448.0f, 1e9f)), 128);
  const float at = std::ldexp(448.0f, -20);
  EXPECT_EQ(rceil(at), 107);
  EXPECT_EQ(rceil(std::nextafter(at, 1.0f)), 108);  // where torchao's fp32 log2 rounds down
  EXPECT_EQ(rceil(std::nextafter(at, 0.0f)), 107);
  EXPECT_EQ(rceil(1.0f), 119);  // ceil(log2(1 / 448)) = -8
  EXPECT_EQ(rceil(0.0f), 0);
  EXPECT_EQ(rceil(std::numeric_limits<float>::max()), 127 + 120);
  EXPECT_EQ(rceil(std::numeric_limits<float>::infinity()), 254);
  EXPECT_EQ(rceil(std::numeric_limits<float>::quiet_NaN()), kE8m0Nan);
  EXPECT_EQ(rceil(std::numeric_limits<float>::denorm_min()), 0);

  EXPECT_EQ(floor(448.0f), 127);  // floor(log2 448) = 8 = emax
  EXPECT_EQ(floor(511.9f), 127);
  EXPECT_EQ(floor(512.0f), 128);
  EXPECT_EQ(floor(1.0f), 119);
  EXPECT_EQ(floor(0.0f), 0);
  EXPECT_EQ(floor(std::numeric_limits<float>::infinity()), 127 + 128 - 8);
  EXPECT_EQ(
      block_scale_code(ElemType::kE5M2, ScaleMode::kFloor, std::numeric_limits<float>::infinity()),
      127 + 128 - 15);
  EXPECT_EQ(floor(std::numeric_limits<float>::quiet_NaN()), kE8m0Nan);
  EXPECT_EQ(block_scale_code(ElemType::kE5M2, ScaleMode::kRceil, 57344.0f), 127);
  EXPECT_EQ(block_scale_code(ElemType::kE5M2, ScaleMode::kRceil, 57345.0f), 128);
}

TEST(MxTypes, RceilIsTheSmallestPowerOfTwoThatFits) {
  std::mt19937 gen(11);
  for (const ElemType type : kTypes) {
    for (int trial = 0; trial < 20000; ++trial) {
      const float amax = std::fabs(random_float(gen, -149, 127));
      ASSERT_EQ(block_scale_code(type, ScaleMode::kRceil, amax), rceil_by_search(type, amax))
          << amax;
    }
    for (int k = -130; k <= 120; ++k) {  // the boundaries 448 * 2^k and their neighbours
      const float at = std::ldexp(elem_max(type), k);
      if (at == 0.0f || std::isinf(at)) continue;
      for (const float amax : {at, std::nextafter(at, 0.0f), std::nextafter(at, 1e38f)}) {
        ASSERT_EQ(block_scale_code(type, ScaleMode::kRceil, amax), rceil_by_search(type, amax))
            << amax;
      }
    }
  }
}

TEST(MxTypes, FloorIsTheOcpRule) {
  std::mt19937 gen(13);
  for (const ElemType type : kTypes) {
    for (int trial = 0; trial < 20000; ++trial) {
      const float amax = std::fabs(random_float(gen, -126, 126));  // normal: log2 is its exponent
      const int expected = std::max(-127, std::ilogb(amax) - elem_emax(type)) + 127;
      ASSERT_EQ(block_scale_code(type, ScaleMode::kFloor, amax), expected) << amax;
    }
  }
}

TEST(MxTypes, QuantizeEncodesEachValueOverItsBlockScale) {
  std::mt19937 gen(17);
  const int64_t rows = 5, cols = 96, ldx = 100;
  std::vector<float> x(rows * ldx);
  for (int64_t r = 0; r < rows; ++r) {
    const int shift = 20 * static_cast<int>(r) - 40;  // blocks from 2^-60 to 2^40
    for (auto it = x.begin() + r * ldx; it != x.begin() + (r + 1) * ldx; ++it) {
      *it = random_float(gen, shift - 12, shift);
    }
  }
  x[1 * ldx + 40] = 0.0f;
  x[2 * ldx + 3] = -0.0f;
  for (const ElemType type : kTypes) {
    for (const ScaleMode mode : kModes) {
      std::vector<uint8_t> codes(rows * cols), scales(rows * cols / kMxBlock);
      quantize(type, mode, rows, cols, x.data(), ldx, codes.data(), scales.data());
      std::vector<float> back(rows * cols);
      dequantize(type, rows, cols, codes.data(), scales.data(), back.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / kMxBlock; ++b) {
          float amax = 0.0f;
          for (int64_t i = 0; i < kMxBlock; ++i) {
            amax = std::max(amax, std::fabs(x[r * ldx + b * kMxBlock + i]));
          }
          const uint8_t scale = scales[r * (cols / kMxBlock) + b];
          ASSERT_EQ(scale, block_scale_code(type, mode, amax));
          const double power = std::ldexp(1.0, scale - 127);
          for (int64_t i = 0; i < kMxBlock; ++i) {
            const int64_t c = b * kMxBlock + i;
            const double quotient = static_cast<double>(x[r * ldx + c]) / power;  // exact
            ASSERT_EQ(codes[r * cols + c], nearest_code(type, quotient))
                << elem_type_name(type) << " " << scale_mode_name(mode) << " r" << r << " c" << c;
            ASSERT_EQ(static_cast<double>(back[r * cols + c]),
                      static_cast<double>(decode_elem(type, codes[r * cols + c])) * power);
          }
        }
      }
    }
  }
}

TEST(MxTypes, NanAndInfInsideABlock) {
  std::vector<float> x(64, 1.5f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[40] = -std::numeric_limits<float>::infinity();
  for (const ElemType type : kTypes) {
    std::vector<uint8_t> codes(64), scales(2);
    std::vector<float> back(64);
    quantize(type, ScaleMode::kRceil, 1, 64, x.data(), 64, codes.data(), scales.data());
    dequantize(type, 1, 64, codes.data(), scales.data(), back.data());
    EXPECT_EQ(scales[0], kE8m0Nan);  // a NaN anywhere makes the whole block NaN
    for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
    EXPECT_EQ(scales[1], 254);                    // an infinity saturates the scale ...
    EXPECT_EQ(codes[40], 0x80 | max_code(type));  // ... and itself to -max
    EXPECT_EQ(codes[41], 0x00);                   // 1.5 * 2^-127 is far below the smallest element
    quantize(type, ScaleMode::kFloor, 1, 64, x.data(), 64, codes.data(), scales.data());
    EXPECT_EQ(scales[0], kE8m0Nan);
    EXPECT_EQ(scales[1], 127 + 128 - elem_emax(type));
    EXPECT_EQ(codes[40], 0x80 | max_code(type));
  }
}

TEST(MxTypes, ContractionNotAMultipleOf32IsAnError) {
  std::vector<float> x(100, 1.0f);
  std::vector<uint8_t> codes(100), scales(4);
  try {
    quantize(ElemType::kE4M3, ScaleMode::kRceil, 1, 100, x.data(), 100, codes.data(),
             scales.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("k=100 is not a positive multiple of the MX block size 32"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_THROW(dequantize(ElemType::kE4M3, 1, 48, codes.data(), scales.data(), x.data()), Error);
  EXPECT_THROW(check_mx_contraction("op", 0), Error);
  EXPECT_NO_THROW(check_mx_contraction("op", 64));
  EXPECT_THROW(parse_elem_type("e3m4", "--elem"), Error);
  EXPECT_THROW(parse_scale_mode("ceil", "--scale"), Error);
  EXPECT_EQ(parse_scale_mode("floor", "--scale"), ScaleMode::kFloor);
}

}  // namespace
}  // namespace moecore::mx
