// A run's whole configuration: [model], [optim], [train], [data] tables of a TOML file, plus
// `--set section.key=value` overrides. Unknown tables or keys and wrong value types are errors, so
// a typo never silently falls back to a default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "optim/optim_config.h"

namespace moecore {

struct TrainConfig {
  uint64_t seed = 0;
  int64_t max_steps = 1000;
  int64_t batch_size = 8;  // sequences per optimizer step
  int64_t seq_len = 128;
  int64_t threads = 0;  // 0: every core
  int64_t log_every = 10;
  int64_t eval_every = 100;
  int64_t eval_batches = 8;
  double max_seconds = 0.0;  // 0: no wall-clock limit
  std::string out_dir = "runs/default";
};

struct DataConfig {
  std::string corpus = "kjv";  // "kjv": Debian's bible-kjv-text; otherwise a path to a text file
  double val_fraction = 0.05;
};

struct RunConfig {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  DataConfig data;
};

// Parses a TOML file (or the text of one) and applies overrides such as "train.max_steps=50".
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
RunConfig parse_run_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {});

// The effective configuration as TOML text (saved with every run).
std::string run_config_to_toml(const RunConfig& config);

// "model.hidden_size: 128 vs 256" for the first [model] key on which a and b differ, or "" if none.
std::string model_config_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace moecore
