#include "plan/pipeline_simulation.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "dist/pipeline_schedule.h"

namespace moecore::plan {

PipelineTimeline simulate_pipeline(PipelineSchedule kind, int64_t pp, int64_t v, int64_t m,
                                   const std::vector<std::vector<Seconds>>& forward,
                                   const std::vector<std::vector<Seconds>>& backward,
                                   double transfer_seconds) {
  const auto pps = static_cast<size_t>(pp);
  MOE_CHECK(forward.size() == pps && backward.size() == pps,
            "[plan] pipeline simulation needs the costs of all {} stages", pp);
  std::vector<std::vector<dist::PipelineAction>> actions(pps);
  for (size_t s = 0; s < pps; ++s) {
    actions[s] = dist::pipeline_schedule(kind, pp, static_cast<int64_t>(s), v, m);
    MOE_CHECK(
        forward[s].size() == static_cast<size_t>(v) && backward[s].size() == static_cast<size_t>(v),
        "[plan] pipeline simulation needs {} chunk costs on stage {}", v, s);
  }
  // When each (global chunk, micro-batch) pass ends; NaN: not yet simulated.
  const int64_t chunks = pp * v;
  constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> forward_end(static_cast<size_t>(chunks * m), kUnknown);
  std::vector<double> backward_end = forward_end;
  const auto at = [m](int64_t g, int64_t micro) { return static_cast<size_t>(g * m + micro); };

  PipelineTimeline t;
  t.finish.assign(pps, 0.0);
  t.busy.assign(pps, Seconds{});
  t.wait.assign(pps, 0.0);
  t.last_backward.assign(pps, 0.0);
  std::vector<size_t> next(pps, 0);
  size_t remaining = 0;
  for (const auto& a : actions) remaining += a.size();
  while (remaining > 0) {
    bool progressed = false;
    for (size_t s = 0; s < pps; ++s) {
      // Run this stage's actions in order for as long as their inputs are known.
      while (next[s] < actions[s].size()) {
        const dist::PipelineAction& a = actions[s][next[s]];
        const int64_t g = static_cast<int64_t>(s) + a.chunk * pp;
        double arrival = 0.0;
        if (a.forward && g > 0) {
          const double sent = forward_end[at(g - 1, a.micro)];
          if (sent != sent) break;  // NaN: the previous chunk has not run it yet
          arrival = sent + transfer_seconds;
        } else if (!a.forward && g < chunks - 1) {
          const double sent = backward_end[at(g + 1, a.micro)];
          if (sent != sent) break;
          arrival = sent + transfer_seconds;
        }
        const double start = std::max(t.finish[s], arrival);
        t.wait[s] += start - t.finish[s];
        const Seconds& cost = (a.forward ? forward : backward)[s][static_cast<size_t>(a.chunk)];
        const double duration = total_seconds(cost);
        for (int i = 0; i < kTimeCategories; ++i)
          t.busy[s][static_cast<size_t>(i)] += cost[static_cast<size_t>(i)];
        t.finish[s] = start + duration;
        if (!a.forward && a.micro == m - 1) t.last_backward[s] += duration;
        (a.forward ? forward_end : backward_end)[at(g, a.micro)] = t.finish[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    MOE_CHECK(progressed, "[plan] pipeline schedule deadlocks: {} actions cannot start", remaining);
  }
  return t;
}

}  // namespace moecore::plan
