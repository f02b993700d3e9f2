#include "cli/plan_command.h"

#include <fmt/format.h>

#include "core/check.h"
#include "plan/plan.h"
#include "train/run_config.h"

namespace moecore::cli {

void run_plan(const PlanArgs& args) {
  const RunConfig config = load_run_config(args.config, args.overrides);
  MOE_CHECK(args.ranks >= 0, "[plan] --ranks={} must be positive", args.ranks);
  const int64_t world = args.ranks > 0 ? args.ranks : config.parallel.pp * config.parallel.ep;
  const plan::Plan p = plan::make_plan(config, world, plan::load_hardware(args.hardware));
  if (args.json)
    fmt::print("{}\n", plan::plan_json(p).dump());
  else
    fmt::print("{}", plan::plan_text(p));
}

}  // namespace moecore::cli
