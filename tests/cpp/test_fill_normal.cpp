// kernels::fill_normal: every target holds exactly the values its own std::mt19937_64 stream gives
// through std::normal_distribution<float> (bit for bit), whatever the thread count, so parameters
// drawn in parallel are the parameters drawn one by one.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/fill_normal.h"

namespace moecore {
namespace {

std::vector<float> serial_normal_draw(size_t count, uint64_t seed, float stddev) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (auto& v : values) v = normal(engine);
  return values;
}

TEST(FillNormal, EveryTargetIsItsOwnStreamOnAnyThreadCount) {
  // Sizes from empty to larger than the rest together, so that threads finish out of order.
  const std::vector<size_t> sizes = {0, 1, 7, 1000, 3, 100003, 64, 2};
  const int previous = omp_get_max_threads();
  for (const int threads : {1, 2, 5}) {
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> targets;
    std::vector<kernels::NormalFill> fills;
    for (size_t t = 0; t < sizes.size(); ++t) targets.emplace_back(sizes[t], -1.0f);
    for (size_t t = 0; t < sizes.size(); ++t)
      fills.push_back({targets[t].data(), sizes[t], 0x1234567ull * (t + 1), t % 2 ? 0.02f : 1.0f});
    kernels::fill_normal(fills);
    for (size_t t = 0; t < sizes.size(); ++t) {
      const std::vector<float> expected =
          serial_normal_draw(sizes[t], fills[t].seed, fills[t].stddev);
      // EXPECT, not ASSERT: the thread count is restored below whatever happens.
      EXPECT_EQ(targets[t], expected) << "target " << t << " with " << threads << " threads";
    }
  }
  omp_set_num_threads(previous);
}

// trunc_normal_'s distribution: a draw beyond 3 stddev is drawn again from the same stream.
TEST(FillNormal, TruncatedRedrawsBeyondThreeStddev) {
  const size_t n = 200000;  // about 540 draws beyond 3 sigma
  const float stddev = 0.5f;
  std::vector<float> values(n);
  const std::vector<kernels::NormalFill> fills = {{values.data(), n, 99, stddev, true}};
  kernels::fill_normal(fills);
  std::mt19937_64 engine(99);
  std::normal_distribution<float> normal(0.0f, stddev);
  size_t redrawn = 0;
  for (size_t i = 0; i < n; ++i) {
    float expected = normal(engine);
    while (std::fabs(expected) > 3.0f * stddev) {
      expected = normal(engine);
      ++redrawn;
    }
    ASSERT_EQ(values[i], expected) << i;
    ASSERT_LE(std::fabs(values[i]), 3.0f * stddev);
  }
  EXPECT_GT(redrawn, 300u);  // the untruncated stream does pass 3 sigma: the cut did something
}

}  // namespace
}  // namespace moecore
