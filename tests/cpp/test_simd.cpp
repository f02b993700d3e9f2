// The vectorisable exp (core/simd.h) against the correctly rounded e^x: every float in
// [-87.34, 88.72] at a stride, within 2 ulp, and the edge cases (0, underflow, overflow, NaN);
// the lane sums' order of additions.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "core/simd.h"
#include "core/splitmix64.h"

namespace moecore {
namespace {

// Distance in units in the last place between two positive finite floats.
int64_t ulp_distance(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST(SimdExp, WithinTwoUlpOverTheNormalRange) {
  int64_t worst = 0, checked = 0;
  float worst_x = 0.0f;
  // Every 97th float bit pattern of each sign: ~44M values, a few hundred ms.
  for (const float lo_sign : {1.0f, -1.0f}) {
    for (uint32_t bits = 0; bits < 0x7f800000u; bits += 97) {
      const float x = lo_sign * std::bit_cast<float>(bits);
      if (x < -87.33f || x > 88.72f) continue;
      const float reference = static_cast<float>(std::exp(static_cast<double>(x)));
      const int64_t d = ulp_distance(exp_vectorizable(x), reference);
      if (d > worst) worst = d, worst_x = x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1'000'000);
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  RecordProperty("worst_ulp", static_cast<int>(worst));
}

TEST(SimdExp, EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
  EXPECT_EQ(exp_vectorizable(-0.0f), 1.0f);
  EXPECT_EQ(exp_vectorizable(-100.0f), 0.0f);
  EXPECT_EQ(exp_vectorizable(-inf), 0.0f);
  EXPECT_EQ(exp_vectorizable(89.0f), inf);
  EXPECT_EQ(exp_vectorizable(inf), inf);
  EXPECT_TRUE(std::isnan(exp_vectorizable(std::numeric_limits<float>::quiet_NaN())));
  // The top of the range stays finite and accurate (2^128 is reached through two factors).
  EXPECT_TRUE(std::isfinite(exp_vectorizable(88.72283f)));
  EXPECT_LE(ulp_distance(exp_vectorizable(88.7f),
                         static_cast<float>(std::exp(static_cast<double>(88.7f)))),
            2);
  EXPECT_LE(ulp_distance(exp_vectorizable(-87.3f),
                         static_cast<float>(std::exp(static_cast<double>(-87.3f)))),
            2);
}

// 2^24 first, then fifteen ones: in lane order each 1 is lost to rounding (2^24 + 1 is a tie,
// rounded to the even 2^24); an order that adds ones together before they meet the 2^24 keeps them.
TEST(SimdExp, SumLanesAddsInLaneOrder) {
  float lanes[kSumLanes];
  lanes[0] = 0x1p24f;
  for (int64_t l = 1; l < kSumLanes; ++l) lanes[l] = 1.0f;
  EXPECT_EQ(sum_lanes(lanes), 0x1p24f);
}

// lane_sum computes its terms a block at a time (256 of them) before adding them to the lanes:
// the sum must still be element j added to lane j % kSumLanes in increasing j, then the lanes in
// order, bit for bit, on either side of a block's end and with a partial last row of lanes. The
// terms have random signs, mantissas and exponents over 25 binades, 20 draws per length; another
// order of additions gives other bits in about half the draws or more (measured): the lanes
// shifted by one from 16 terms on, each lane's terms reversed from 255 on (with two terms in a
// lane the order cannot show), the last partial row in other lanes wherever there is one.
TEST(SimdExp, LaneSumAddsEachTermToItsLaneInOrder) {
  for (const int64_t n : {0, 1, 15, 16, 17, 255, 256, 257, 271, 512, 1000, 4099}) {
    for (uint64_t draw = 0; draw < 20; ++draw) {
      const auto term = [draw](int64_t j) {
        const uint64_t bits = mix64(draw * 1000003u + static_cast<uint64_t>(j) + 1);
        const float magnitude = std::ldexp(1.0f + static_cast<float>(bits >> 41) * 0x1p-23f,
                                           static_cast<int>((bits >> 8) % 25) - 12);
        return (bits & 1) != 0 ? -magnitude : magnitude;
      };
      float lanes[kSumLanes] = {};
      for (int64_t j = 0; j < n; ++j) lanes[j % kSumLanes] += term(j);
      ASSERT_EQ(std::bit_cast<uint32_t>(lane_sum(n, term)),
                std::bit_cast<uint32_t>(sum_lanes(lanes)))
          << "n = " << n << ", draw " << draw;
    }
  }
}

}  // namespace
}  // namespace moecore
