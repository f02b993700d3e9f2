// Inspection subcommands used by the reference tests: one forward/backward dumped tensor by tensor
// (debug-state) and N optimizer steps on one batch (debug-steps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::cli {

// A [B, T] int32/int64 array of token ids (or targets) from a .npy file.
struct IdArray {
  std::vector<int32_t> values;
  int64_t batch = 0, seq = 0;
};
IdArray read_ids(const std::string& path);

struct DebugArgs {
  std::string config, weights, tokens, targets, out;
  int64_t steps = 1;
};

void run_init(const std::string& config_path, uint64_t seed, const std::string& out);
void run_debug_state(const DebugArgs& args);
void run_debug_steps(const DebugArgs& args);

}  // namespace moecore::cli
