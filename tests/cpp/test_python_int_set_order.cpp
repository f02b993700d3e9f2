// data/python_int_set_order.h against CPython's own iteration order of sets of ints, pinned from
// Python 3.11 (`list({x for x in values})`); tests/train/test_downstream_eval.py holds it
// against olmo_eval's fast multiple-choice samples end to end.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "data/python_int_set_order.h"

namespace moecore::data {
namespace {

TEST(PythonIntSetOrder, MatchesCPythonsIteration) {
  using V = std::vector<int64_t>;
  const std::vector<std::pair<V, V>> cases = {
      {{3, 10, 18}, {18, 10, 3}},
      {{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}},
      {{5, 3, 1, 0}, {0, 1, 3, 5}},
      {{100, 7, 64, 9, 33, 1000, 12, 5, 8}, {64, 33, 100, 5, 7, 1000, 9, 8, 12}},
      {{1000, 2000, 3000, 4000, 5000, 6000, 7000}, {4000, 1000, 5000, 2000, 6000, 7000, 3000}},
      {{30, 27, 24, 21, 18, 15, 12, 9, 6, 3, 1000003, 77},
       {3, 1000003, 6, 9, 12, 77, 15, 18, 21, 24, 27, 30}},
      {{18, 3, 1000, 10, 64, 33, 3, 18}, {64, 33, 3, 1000, 10, 18}},  // repeats added once
      // 40 values below 5000 (random.seed(1)): several resizes and collisions.
      {{1100, 4662, 516,  2089, 965,  4058, 3682, 3868, 3109, 1719, 768,  3996, 232,  3193,
        3545, 4976, 17,   3648, 2181, 1874, 4842, 837,  2600, 250,  182,  208,  4435, 75,
        3122, 1774, 3457, 237,  4322, 1816, 3587, 4061, 4529, 1909, 2831, 1891},
       {768,  3457, 3587, 516,  2181, 2831, 17,  1816, 3996, 3868, 3109, 2600, 2089, 4529,
        3122, 4662, 1719, 182,  3648, 965,  837, 75,   1100, 208,  1874, 4435, 3545, 4058,
        4061, 3682, 4322, 1891, 232,  4842, 237, 1774, 4976, 1909, 3193, 250}},
  };
  for (const auto& [values, expected] : cases) EXPECT_EQ(python_int_set_order(values), expected);
  EXPECT_TRUE(python_int_set_order({}).empty());
  EXPECT_THROW(python_int_set_order({1, -2}), Error);
}

}  // namespace
}  // namespace moecore::data
