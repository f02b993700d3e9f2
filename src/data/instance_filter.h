// OLMo-core's instance filter (InstanceFilterConfig, data/numpy_dataset.py): an instance whose
// tokens repeat a short period too many times is masked, its labels all ignored, as OLMo-core's
// datasets mark it (instance_mask False) and get_labels masks it. The repetitions are found as
// OLMo-core's find_periodic_sequences finds them (data/utils.py), quirks included, so that the
// same instances are masked: for each period p the tokens are laid out in rows of p (padded
// with -1 to a whole last row and one more where p divides the length), each row compared with
// the one before it (the first with the last, numpy's roll), runs of wholly equal rows widened
// by the equal tail of the row before and the equal head of the row after; a run is a
// repetition when it spans more than two periods. Periods beyond a third of the instance are
// not looked at (a repetition needs three periods).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moecore::data {

// InstanceFilterConfig's fields and defaults.
struct RepetitionFilter {
  int64_t max_period = 13;  // repetition_max_period
  int64_t min_period = 1;   // repetition_min_period
  int64_t max_count = 32;   // repetition_max_count: masked at this many periods or more
  bool operator==(const RepetitionFilter&) const = default;
};

// One repetition, as OLMo-core's RepetitionTuple: tokens [start, end) repeat `period` tokens
// `times` whole times ((end - start) // period, always more than two).
struct Repetition {
  int64_t start = 0;
  int64_t end = 0;
  int64_t period = 0;
  int64_t times = 0;
  bool operator==(const Repetition&) const = default;
};

// Every repetition of `tokens` (ids >= 0) with a period in [min_period, max_period], in
// OLMo-core's order (by period, then position).
std::vector<Repetition> find_periodic_sequences(std::span<const int32_t> tokens, int64_t max_period,
                                                int64_t min_period = 1);

// OLMo-core's _validate_instance: false (masked) where some repetition spans max_count periods
// or more.
bool keeps_instance(std::span<const int32_t> tokens, const RepetitionFilter& filter);

}  // namespace moecore::data
