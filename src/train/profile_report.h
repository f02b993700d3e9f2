// The time breakdown of a profiled run (train.profile = true): seconds per phase accumulated by
// core/phase_timer.h over `steps` steps that took `seconds` of wall-clock time, and the rest of
// the step ("other": embeddings, norms, residuals, loss bookkeeping, metrics) as the difference.
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

// {"steps": S, "seconds": T, "phases": {"attention_forward": s, ..., "other": s}} (pretty JSON).
std::string profile_report_json(int64_t steps, double seconds);
// One line for the log: "profile: 10 steps, 812 ms/step: attention 21.3%, router 1.2%, ...".
std::string profile_report_line(int64_t steps, double seconds);

}  // namespace moecore
