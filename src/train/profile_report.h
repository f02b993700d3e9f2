// The time breakdown of a profiled run (train.profile = true): seconds per phase accumulated by
// core/phase_timer.h over `steps` steps that took `seconds` of wall-clock time, and the rest of
// the step ("other": embeddings, norms, residuals, loss bookkeeping, metrics) as the difference;
// and where those steps read device memory back (core/device_memory.h's HostReadLog: each read
// is a wait for the device; a run on host memory has none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_memory.h"

namespace moecore {

// {"steps": S, "seconds": T, "phase_clock": what timed the phases ("host wall clock", or the
//  device's clock: core/phase_timer.h's DevicePhaseClock), "phases": {"attention_forward": s,
//  ..., "other": s}, "host_reads": [{"phase": p, "what": w, "count": n}, ...] (HostReadLog's, by
//  first occurrence)} (pretty JSON). With train.cuda_graph the steps replayed from a graph run no
//  host code and add nothing to the phases (their time is in "other").
std::string profile_report_json(int64_t steps, double seconds, const std::vector<HostRead>& reads);
// One line for the log: "profile: 10 steps, 812 ms/step: attention 21.3%, router 1.2%, ...",
// ending "; 3.0 host reads/step" when the steps read device memory back.
std::string profile_report_line(int64_t steps, double seconds, const std::vector<HostRead>& reads);

}  // namespace moecore
