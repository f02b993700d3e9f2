// trainer_state.json: where a checkpointed run stands (step, tokens seen, data cursor, seed, the
// step guard's and the gerrymandering detector's windows). It is read back on --resume and
// trusted by nothing: every field is type- and range-checked, and the step, the data cursor and
// the token count must agree with the configuration that wrote them (a cursor of -1 or 2^63 - 1
// would silently change the data order; a step of -5 trained with a negative learning rate).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset_fingerprint.h"
#include "optim/lr_schedule.h"
#include "train/run_config.h"

namespace moecore {

// The step, data cursor and token count at which the current data settings (batch size, sequence
// length) took over: zero for a run that never changed them; set when --allow-config-change
// resumes with another batch size or sequence length. From there, every step adds batch_size
// instances and batch_size x seq_len tokens.
struct ReplayOrigin {
  int64_t step = 0;
  uint64_t data_cursor = 0;
  int64_t tokens_seen = 0;
  // Under data.order = "olmo-core": OLMo-core's loader state there, its epoch (from 1; 0: not
  // recorded) and the tokens it had read of it (tokens_processed, which its load_state_dict keeps
  // as it was, so tokens that filled no whole batch of the new size still count in that epoch).
  uint64_t epoch = 0;
  int64_t epoch_tokens = 0;
  bool operator==(const ReplayOrigin&) const = default;
};

struct TrainerState {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  uint64_t data_cursor = 0;
  uint64_t seed = 0;
  ReplayOrigin origin;
  nlohmann::json step_guard;      // StepGuard::from_json's input, checked
  nlohmann::json gerrymandering;  // GerrymanderingDetector::from_json's input, checked
  nlohmann::json spike_monitor;   // SpikeMonitor::from_json's input, checked (null: none saved)
  // Whether the checkpoint promises its checksum manifest ("checksums": kChecksumsFile, which
  // commit_checkpoint adds): then a missing manifest is damage, not an older checkpoint.
  bool has_checksums = false;
  // Which revision of the precision recipes wrote it (kRecipeRevision; 1 when it does not say).
  int64_t recipe_revision = 1;
  // The training set it read (absent in older checkpoints): a resume on other contents under the
  // same data.train is a change of the replay (train/resume_policy.h).
  std::optional<data::DatasetFingerprint> train_data;
  // OpenMP threads per rank of the run that wrote it (0: not recorded): on the CPU the kernels
  // split their sums by thread, so another count continues close to, not on, the path.
  int64_t threads = 0;
  // A stop signal cancelled the evaluation due at this step (train.eval_every): the resumed run
  // makes it up before its first step, so that metrics.jsonl has every validation row.
  bool eval_pending = false;
  // Under train.batch_sizes: the batch sizes in force so far, in order (the first
  // train.batch_size, the last the one the run reads now; train/batch_size_schedule.h). Empty:
  // train.batch_size throughout.
  std::vector<int64_t> batch_size_history;
  // The batch size the run read at its last update, of the run that wrote it (`written_by`).
  int64_t batch_size_in_force(const TrainConfig& written_by) const {
    return batch_size_history.empty() ? written_by.batch_size : batch_size_history.back();
  }
};

// What a schedule in tokens counts from (optim/lr_schedule.h): the origin's step and tokens seen.
inline TokenOrigin token_origin(const ReplayOrigin& origin) {
  return {origin.step, origin.tokens_seen};
}

// Where a run resumed from `saved` counts its tokens from: the checkpoint's replay origin, or,
// when the resume changes the configuration (a new origin starts there), the checkpoint's own
// step and tokens seen.
inline TokenOrigin schedule_origin(const TrainerState& saved, bool config_changed) {
  return config_changed ? TokenOrigin{saved.step, saved.tokens_seen} : token_origin(saved.origin);
}

// Revisions of the precision recipes that change a run's numbers under unchanged keys: 2, mxfp8
// runs the shared expert as OLMo-core's recipe does (MX forward and input gradient); 1, in bf16.
inline constexpr int64_t kRecipeRevision = 2;

// The checkpoint's checksum manifest (io/file_checksums.h), named in its trainer state.
inline constexpr const char* kChecksumsFile = "checksums.json";

// Parses and checks trainer_state.json text; `origin` names the file in errors, `written_by` is
// the [train] table of the configuration saved beside it. Errors name file, key and value.
TrainerState parse_trainer_state(std::string_view text, const std::string& origin,
                                 const TrainConfig& written_by);
// Reads <checkpoint_dir>/trainer_state.json and parses it as above.
TrainerState load_trainer_state(const std::string& checkpoint_dir, const TrainConfig& written_by);

// A checkpoint's configuration (read as ScheduleLength::kResumed: its run checked the schedule)
// and its trainer state, checked against it: what `data order --resume` and `lr-schedule
// --resume` start from. A directory without trainer_state.json is a one-line error under `tag`.
struct SavedRun {
  RunConfig config;
  TrainerState state;
};
SavedRun load_saved_run(const std::string& checkpoint_dir, const char* tag);

}  // namespace moecore
