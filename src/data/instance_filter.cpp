#include "data/instance_filter.h"

#include <algorithm>

#include "core/check.h"

namespace moecore::data {

namespace {

// The rows of one period: row r holds tokens [r p, (r + 1) p), the padding past the tokens -1.
class PeriodRows {
 public:
  PeriodRows(std::span<const int32_t> tokens, int64_t period)
      : tokens_(tokens),
        period_(period),
        // numpy.pad(arr, (0, p - len % p)): at least one pad, a whole row where p divides len.
        rows_(static_cast<int64_t>(tokens.size()) / period + 1) {}

  int64_t rows() const { return rows_; }

  // Element c of row r equals element c of the row before it (row 0: the last row).
  bool equal_to_previous(int64_t r, int64_t c) const {
    const int64_t previous = r == 0 ? rows_ - 1 : r - 1;
    return at(r * period_ + c) == at(previous * period_ + c);
  }

  bool row_equal_to_previous(int64_t r) const {
    for (int64_t c = 0; c < period_; ++c)
      if (!equal_to_previous(r, c)) return false;
    return true;
  }

  // find_end_first_consecutive_true over row r's comparison: its leading equal elements.
  int64_t leading_equal(int64_t r) const {
    int64_t n = 0;
    while (n < period_ && equal_to_previous(r, n)) ++n;
    return n;
  }

  // find_start_last_consecutive_true over row r's comparison, made into the start offset as
  // find_periodic_sequences makes it: its trailing equal elements, 0 where all are equal.
  int64_t trailing_equal_offset(int64_t r) const {
    int64_t n = 0;
    while (n < period_ && equal_to_previous(r, period_ - 1 - n)) ++n;
    // start = period - n where n > 0 else -1; offset = period - start where start > 0 else 0.
    return n > 0 && n < period_ ? n : 0;
  }

 private:
  int64_t at(int64_t i) const {
    return i < static_cast<int64_t>(tokens_.size()) ? tokens_[static_cast<size_t>(i)] : -1;
  }

  std::span<const int32_t> tokens_;
  int64_t period_;
  int64_t rows_;
};

}  // namespace

std::vector<Repetition> find_periodic_sequences(std::span<const int32_t> tokens, int64_t max_period,
                                                int64_t min_period) {
  MOE_CHECK(min_period >= 1, "[data] a repetition's minimum period must be positive, got {}",
            min_period);
  std::vector<Repetition> found;
  const int64_t longest = std::min(max_period, static_cast<int64_t>(tokens.size()) / 3);
  for (int64_t period = min_period; period <= longest; ++period) {
    const PeriodRows rows(tokens, period);
    // Runs of consecutive rows each wholly equal to the row before it. Row 0 never is (the last
    // row holds padding at its end, row 0 tokens), nor is the last row (the row before it has no
    // padding), so a run has a row before it and a row after it.
    for (int64_t r = 0; r < rows.rows();) {
      if (!rows.row_equal_to_previous(r)) {
        ++r;
        continue;
      }
      const int64_t first = r;
      while (r + 1 < rows.rows() && rows.row_equal_to_previous(r + 1)) ++r;
      const int64_t last = r++;
      const int64_t start = (first - 1) * period - rows.trailing_equal_offset(first - 1);
      const int64_t end = (last + 1) * period + rows.leading_equal(last + 1);
      const int64_t times = (end - start) / period;
      // Fewer than three periods cannot be told apart from chance with this sweep.
      if (times > 2) found.push_back({start, end, period, times});
    }
  }
  return found;
}

bool keeps_instance(std::span<const int32_t> tokens, const RepetitionFilter& filter) {
  for (const Repetition& r : find_periodic_sequences(tokens, filter.max_period, filter.min_period))
    if (r.times >= filter.max_count) return false;
  return true;
}

}  // namespace moecore::data
