// `moecore plan`: everything the planner says about one config at one world size, from the config
// alone: parameter counts, model FLOPs per token, per pipeline stage the memory of a rank and the
// bytes each collective moves per step, and, when the hardware profile has rates, the step time.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/flop_count.h"
#include "plan/comm_model.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/param_count.h"
#include "plan/step_time.h"
#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

struct Plan {
  RunConfig config;
  ResolvedLayout layout;
  ParamCounts params;
  FlopsPerToken flops;
  Hardware hardware;
  std::vector<RankMemory> stages;                   // one rank of each pipeline stage
  std::vector<std::vector<CollectiveBytes>> comms;  // per stage
  bool has_step_time = false;                       // the hardware profile has rates
  StepTime step;
  double peak_bytes() const;  // the largest rank's
  bool fits() const { return peak_bytes() <= hardware.memory_bytes; }
};

// Checks the layout as the trainer does (one-line error naming the constraint) and plans it.
Plan make_plan(const RunConfig& config, int64_t world, const Hardware& hardware);

nlohmann::json plan_json(const Plan& plan);
// FLOPs per token by part and their total (also `moecore bench flops`' output).
nlohmann::json flops_json(const FlopsPerToken& flops);
std::string plan_text(const Plan& plan);

}  // namespace moecore::plan
