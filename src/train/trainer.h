// The training job: data (OLMo-core token files), gradient accumulation, the step guard,
// validation, metrics (stdout, metrics.jsonl, TensorBoard), MoE diagnostics with the gerrymandering
// detector, atomic checkpoints with exact resume, and a generated sample at the end. train() is
// the loop and its wiring; each of those concerns is a callback (train/callback.h,
// train/callbacks/).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/run_config.h"

namespace moecore {

class Callback;

struct TrainOptions {
  bool resume = false;  // continue from the newest valid checkpoint in train.out_dir
  // Resume even where the config differs from the checkpoint's in a way that breaks exact replay
  // (train/resume_policy.h); each difference is logged.
  bool allow_config_change = false;
  // A Hugging Face model directory to take the initial weights from (io/hf_weights_reader.h)
  // instead of the seeded initialisation; the config's [model] must describe it (cli/init_from.h).
  // Before the first step the weights pass the round-trip self-check (train/round_trip_check.h).
  // Refused when --resume finds a checkpoint: a run started from it continues from its own
  // checkpoints.
  std::string init_from;
  // The device train.device names as the program selected it, for the start-up line ("NVIDIA
  // H200 (sm_90, 132 SMs, 139.8 GiB)"); empty on the CPU.
  std::string device_description;
  // The caller's callbacks (train/callback.h), run after the run's own at every point, as
  // OLMo-core's Trainer takes them: they observe the steps of the real loop (a test counts the
  // heap allocations of a step with one).
  std::vector<std::shared_ptr<Callback>> callbacks;
};

struct TrainSummary {
  int64_t start_step = 0;
  int64_t steps = 0;  // optimizer steps completed (including resumed ones)
  int64_t skipped_steps = 0;
  double first_loss = 0.0;
  double last_loss = 0.0;
  std::optional<double> val_loss;  // the final evaluation's; none without one
  int stop_signal = 0;  // the signal that stopped the run after a checkpoint (stop_signals.h), or 0
};

TrainSummary train(const RunConfig& config, const TrainOptions& options);

}  // namespace moecore
