// `moecore plan CONFIG [--set ...] [--ranks N] [--hardware NAME|FILE] [--json]
//  [--max-memory GB [--top N]] [--html FILE]`: parameters, FLOPs, memory per rank, bytes per
// collective and step time of a config at a world size (src/plan/); --max-memory lists the
// fastest layouts that fit GB (10^9 bytes) per rank instead; --html also writes the report page.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::cli {

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t ranks = 0;  // 0: the smallest world the layout allows, pp x ep
  std::string hardware = "cpu";
  bool json = false;
  double max_memory_gb = 0.0;  // 0: plan the config's own layout
  int64_t top = 10;            // layouts --max-memory prints
  std::string html;            // report page to write, if any
};

void run_plan(const PlanArgs& args);

}  // namespace moecore::cli
