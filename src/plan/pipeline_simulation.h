// A small discrete-event simulation of one optimizer step's pipeline: every stage replays its own
// action list from dist::pipeline_schedule (the list the runner executes, not a re-derivation) in
// order, as train/pipeline_runner.cpp does: an action starts when the stage is free and its input
// has arrived (a forward needs the previous chunk's hidden state, a backward the next chunk's
// gradient; the receives are posted ahead, so only the arrival counts), and its output leaves
// with a nonblocking send that does not hold the stage. A transfer takes `transfer_seconds`.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/op_cost.h"
#include "train/run_config.h"

namespace moecore::plan {

struct PipelineTimeline {
  std::vector<double> finish;         // per stage: when its last action ends
  std::vector<Seconds> busy;          // per stage: its actions' own time by category
  std::vector<double> wait;           // per stage: time waiting for inputs (bubble and transfers)
  std::vector<double> last_backward;  // per stage: time of the last micro-batch's backwards,
                                      // during which overlap_grad_reduce starts the reductions
};

// forward[s][c] / backward[s][c]: one micro-batch through stage s's c-th chunk (virtual stage).
PipelineTimeline simulate_pipeline(PipelineSchedule kind, int64_t pp, int64_t virtual_stages,
                                   int64_t microbatches,
                                   const std::vector<std::vector<Seconds>>& forward,
                                   const std::vector<std::vector<Seconds>>& backward,
                                   double transfer_seconds);

}  // namespace moecore::plan
