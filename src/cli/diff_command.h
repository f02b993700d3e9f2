// `moecore diff`: where two runs of one batch part, tensor by tensor in execution order.
//   moecore diff DUMP_A DUMP_B                  two `moecore dump` directories (any builds);
//   moecore diff CONFIG --a-set K=V --b-set K=V runs both sides here on the same weights and batch.
// Exit status: 0 every tensor within the threshold, 1 they part (the first tensor is named), 2 bad
// input (main maps errors of this command to it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/dump_command.h"

namespace moecore::cli {

struct DiffArgs {
  std::vector<std::string> inputs;  // two dump directories, or one config
  DumpArgs run;                     // config mode: the config, --set, weights, batch
  std::vector<std::string> a_set, b_set;
  std::optional<double> threshold;
  bool json = false;
};

inline constexpr int kDiffExitParted = 1;
inline constexpr int kDiffExitBadInput = 2;

// Prints the comparison; returns 0 or kDiffExitParted. Bad input throws.
int run_diff(const DiffArgs& args);

}  // namespace moecore::cli
