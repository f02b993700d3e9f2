// Checkpoints of a training run (train/checkpoint.h): every train.save_every steps and at the end
// (also when a stop signal or max_seconds ends the run), each rank writing its part, rank 0
// committing the directory; and, on --resume, the restore, where each rank reads only what it
// holds.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dist/distributed_optimizer.h"
#include "train/callback.h"
#include "train/checkpoint.h"
#include "train/gerrymandering.h"
#include "train/run_config.h"
#include "train/spike_monitor.h"
#include "train/step_guard.h"
#include "train/trainer_state.h"

namespace moecore {

struct TrainContext;

class CheckpointCallback final : public Callback {
 public:
  // owner_pid: rank 0's process id (the staging directories' names); hf_config: config.json;
  // tokenizer_json: written beside the weights when not empty; hf_side_files: written beside it
  // (io/hf_side_files.h); resumed_step: the step of the checkpoint the run resumed from (nothing
  // to save there again), or nullopt.
  CheckpointCallback(int64_t owner_pid, nlohmann::json hf_config, std::string tokenizer_json,
                     std::map<std::string, std::string> hf_side_files,
                     std::optional<int64_t> resumed_step);
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;

 private:
  void save(TrainContext& ctx);  // collective

  int64_t owner_pid_;
  nlohmann::json hf_config_;
  std::string tokenizer_json_;
  std::map<std::string, std::string> hf_side_files_;
  int64_t last_saved_;
  // Test hook for the "disk full during save" proof: MOECORE_FAULT_WRITE_BYTES=N makes file writes
  // fail with ENOSPC after N more bytes, once the first checkpoint is on disk.
  std::optional<int64_t> write_fault_;
};

// A save every rank of `world` takes part in (train/checkpoint.h's multi-rank protocol): rank 0
// opens the staging directory of `step` under run_dir, every rank writes its `part`, and rank 0
// commits the directory with `contents`, pruning to keep_last, and returns its path (the other
// ranks ""). A write that fails in a single process discards its staging directory; with other
// ranks still writing, the job ends and the next start removes it (remove_interrupted_saves).
std::string save_collectively(const dist::Communicator& world, const std::string& run_dir,
                              int64_t step, int64_t owner_pid, const CheckpointPart& part,
                              const CheckpointContents& contents, int64_t keep_last);

// A resume: this rank's weights and optimizer state from checkpoint `dir` (only the tensors and
// the moment slices it holds are read; the whole checkpoint is checked from its headers against
// `model` and `full`), the step guard's and the gerrymandering detector's windows; returns the
// trainer state (step, tokens, data cursor), checked against `written_by`, the configuration
// saved with it. reset_moments: the Adam moments start from zero instead (the checkpoint's are
// still checked with the rest of it; the step count is the checkpoint's).
TrainerState restore_checkpoint(const std::string& dir, const TrainConfig& written_by,
                                const ModelConfig& model, const ParamLayout& full,
                                const ParamLayout& local, ParamBuffers& params,
                                dist::DistributedOptimizer& optimizer, StepGuard& guard,
                                GerrymanderingDetector& gerrymandering, SpikeMonitor& spikes,
                                bool reset_moments = false);

}  // namespace moecore
