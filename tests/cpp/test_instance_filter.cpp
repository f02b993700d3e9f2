// OLMo-core's instance filter (data/instance_filter.h): repetitions found as its
// find_periodic_sequences finds them, worked by hand here (tests/reference/
// test_olmo_core_instance_filter.py holds the masks to OLMo-core's own dataset).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "data/instance_filter.h"

namespace moecore::data {
namespace {

std::vector<Repetition> repetitions(const std::vector<int32_t>& tokens, int64_t max_period,
                                    int64_t min_period = 1) {
  return find_periodic_sequences(tokens, max_period, min_period);
}

TEST(InstanceFilter, ThreeEqualTokensAreAPeriodOfOne) {
  // Rows of one token: rows 1 and 2 equal the row before; nothing before or after widens them.
  EXPECT_EQ(repetitions({7, 7, 7, 1, 2, 3, 4, 5, 6}, 13), (std::vector<Repetition>{{0, 3, 1, 3}}));
}

TEST(InstanceFilter, ARunIsWidenedByTheRowsAroundIt) {
  // Period 2 rows [9 1] [2 1] [2 1] [2 1] [2 8] [5 4]: rows 2-3 equal the row before; row 1
  // ends in an equal element (start 1 token earlier), row 4 begins with one (end 1 later).
  const std::vector<int32_t> tokens{9, 1, 2, 1, 2, 1, 2, 1, 2, 8, 5, 4};
  EXPECT_EQ(repetitions(tokens, 13), (std::vector<Repetition>{{1, 9, 2, 4}}));
  EXPECT_FALSE(keeps_instance(tokens, {13, 1, 4}));
  EXPECT_TRUE(keeps_instance(tokens, {13, 1, 5}));
  EXPECT_TRUE(keeps_instance(tokens, {13, 3, 3}));  // period 2 is not looked at
  EXPECT_TRUE(keeps_instance(tokens, {1, 1, 3}));
}

TEST(InstanceFilter, ARunToTheEndStopsAtThePadding) {
  EXPECT_EQ(repetitions({5, 3, 3, 3, 3}, 13), (std::vector<Repetition>{{1, 5, 1, 4}}));
}

TEST(InstanceFilter, TwoPeriodsAreNotARepetition) {
  EXPECT_TRUE(repetitions({4, 4, 1, 2, 1, 2, 9, 8, 7}, 13).empty());
}

TEST(InstanceFilter, PeriodsBeyondAThirdAreNotLookedAt) {
  // 1 2 3 4 five times over 20 tokens; with 11 tokens only periods up to 3 are tried.
  std::vector<int32_t> tokens;
  for (int i = 0; i < 5; ++i) tokens.insert(tokens.end(), {1, 2, 3, 4});
  EXPECT_EQ(repetitions(tokens, 4, 4), (std::vector<Repetition>{{0, 20, 4, 5}}));
  EXPECT_TRUE(
      repetitions(std::vector<int32_t>(tokens.begin(), tokens.begin() + 11), 13, 4).empty());
  EXPECT_TRUE(repetitions({1, 1}, 13).empty());
}

TEST(InstanceFilter, EveryPeriodReportsItsOwnRuns) {
  // A period-1 run is also a run of period 2 (and 3): each period reports it.
  const std::vector<Repetition> found = repetitions(std::vector<int32_t>(12, 6), 3);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0], (Repetition{0, 12, 1, 12}));
  EXPECT_EQ(found[1], (Repetition{0, 12, 2, 6}));
  EXPECT_EQ(found[2], (Repetition{0, 12, 3, 4}));
}

TEST(InstanceFilter, AZeroPeriodIsAnError) {
  EXPECT_THROW(repetitions({1, 2, 3}, 13, 0), std::runtime_error);
}

}  // namespace
}  // namespace moecore::data
