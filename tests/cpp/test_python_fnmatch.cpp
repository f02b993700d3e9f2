// python_fnmatch against Python's fnmatch.fnmatchcase: the globs optimizer group overrides are
// written with, the cases where the C library's fnmatch answers otherwise ([^seq], [[:class:]]),
// and random patterns over every special character (python_fnmatch_cases.inc, written by
// make_python_fnmatch_cases.py with Python's own answers).
#include <gtest/gtest.h>

#include "core/python_fnmatch.h"

namespace moecore {
namespace {

struct FnmatchCase {
  const char* pattern;
  const char* name;
  bool matches;
};

constexpr FnmatchCase kFnmatchCases[] = {
#include "python_fnmatch_cases.inc"
};

TEST(PythonFnmatch, AnswersAsPythonDoes) {
  int matching = 0;
  for (const FnmatchCase& c : kFnmatchCases) {
    EXPECT_EQ(python_fnmatch(c.name, c.pattern), c.matches)
        << "pattern '" << c.pattern << "', name '" << c.name << "'";
    matching += c.matches;
  }
  EXPECT_GT(matching, 100);  // the table holds matches and misses both
  EXPECT_GT(static_cast<int>(std::size(kFnmatchCases)) - matching, 100);
}

}  // namespace
}  // namespace moecore
