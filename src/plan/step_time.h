// Step time of a layout (issue 17, item 4): each chunk's forward and backward priced by the
// roofline of plan/op_cost.h, the stages' action lists replayed by plan/pipeline_simulation.h,
// then the gradient reduction of plan/comm_model.h (ring all-reduce 2 (n-1)/n of the buffer,
// reduce-scatter and all-gather (n-1)/n, over the group's link) and the optimizer streaming its
// state through memory. With parallel.overlap_grad_reduce the reduction runs during the last
// micro-batch's backward, but only on hardware whose collectives progress on their own
// (Rates::async_communication); Open MPI on a CPU advances them inside MPI calls, so there it
// adds in full. The step ends when the slowest stage does (the next step's collectives wait).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/hardware.h"
#include "plan/op_cost.h"
#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

struct StepTime {
  double seconds = 0.0;        // one optimizer step
  int64_t critical_stage = 0;  // the stage that ends last
  Seconds breakdown{};         // the critical stage's step by category; sums to seconds
  std::vector<double> stage_seconds;
  double tokens_per_s_per_rank = 0.0;
  double model_flops_per_s_per_rank = 0.0;  // DESIGN.md's model FLOPs per token x tokens/s
  double mfu = 0.0;                         // against the profile's peak of the run's precision
  double bubble = 0.0;                      // the critical stage's pipeline wait / step
};

StepTime step_time(const RunConfig& config, const ResolvedLayout& layout, const Rates& rates);

}  // namespace moecore::plan
