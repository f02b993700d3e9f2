// `moecore plan CONFIG [--set ...] [--ranks N] [--hardware NAME|FILE] [--json]`: parameters,
// FLOPs, memory per rank and bytes per collective of a config at a world size (src/plan/).
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
};

void run_plan(const PlanArgs& args);

}  // namespace moecore::cli
