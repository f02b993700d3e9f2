// `moecore dump`: one batch's forward and backward with every activation, activation gradient,
// loss part and parameter gradient recorded in execution order (io/tensor_dump.h), for
// `moecore diff` to compare against another precision or another build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tensor_dump.h"
#include "train/run_config.h"

namespace moecore::cli {

// What to run: a config with overrides; the weights (a .safetensors, else the initialisation a
// training run starts from, train.seed); the batch (--tokens/--targets .npy, else the first
// `batch_size` instances of data.train in the trainer's order; 0: one micro-batch,
// train.batch_size / train.microbatches).
struct DumpArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string weights, tokens, targets;
  int64_t batch_size = 0;
};

// The pass's config: args.config with args.overrides, then `extra_overrides`.
RunConfig dump_config(const DumpArgs& args, const std::vector<std::string>& extra_overrides);
// Runs the pass of `config` (dump_config's) in this process, on config.train.device.
io::TensorDump record_dump(const DumpArgs& args, const RunConfig& config);
void run_dump(const DumpArgs& args, const std::string& out);

}  // namespace moecore::cli
