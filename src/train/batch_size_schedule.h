// OLMo-core's BatchSizeSchedulerCallback: the global batch grows (or shrinks) by whole factors
// during the run, train.batch_sizes[i] once train.batch_size_starts[i] is reached (run_config.h).
// Before each update (OLMo-core's pre_load_batch) the latest start reached names the batch size;
// a change to it is made as OLMo-core makes it:
//   * an increase waits until the whole batches OLMo-core's loader has read of its epoch are a
//     multiple of the factor (its data_loader.batches_processed % ratio == 0; an epoch read to its
//     end counts as one, whose next starts at 0), so that its batches of the new size lie on the
//     epoch's grid; a decrease is made at once. Under moecore's order, which reads its instances
//     on at any batch size, an increase too is made at once;
//   * the data position moves as OLMo-core's loader's does (its global_batch_size setter:
//     batches_processed // ratio or x ratio; the same as a resume with the new size,
//     train/training_data.h), which a new replay origin records;
//   * the schedule's initial_lr is multiplied by sqrt(new / old) (its _update_batch_size_and_lr;
//     the rates OLMo-core's schedulers hold absolute stay put: optim/lr_schedule.h);
//   * the run's length in updates is recounted where it is tokens or epochs (OLMo-core's
//     Trainer.max_steps reads the loader's batch size each time).
// The micro-batch keeps its sequences; a step has as many more or fewer micro-batches. The sizes
// in force so far are the run's history (trainer_state.json's batch_size_history): a resumed run
// goes on from the last with the initial_lr they give, as the uninterrupted run does.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "train/run_config.h"
#include "train/trainer_state.h"
#include "train/training_data.h"

namespace moecore {

// The batch size the schedule names after `step` updates and `tokens_seen` tokens, in `epoch`
// (from 1, as OLMo-core's trainer counts them): that of its latest start reached (OLMo-core's
// Duration.due: step >= start, tokens_seen >= start, or epoch > start); train.batch_size
// without a schedule.
int64_t scheduled_batch_size(const TrainConfig& t, int64_t step, int64_t tokens_seen,
                             uint64_t epoch = 1);

// `config` with a batch of `batch_size` sequences in force: train.batch_size and
// train.microbatches (the micro-batch's sequences kept) set to it; the schedule's keys kept.
RunConfig with_batch_size(const RunConfig& config, int64_t batch_size);

// Whether a resume from a run of `saved` with `now` changes the batch's keys (train.batch_size,
// microbatches, batch_sizes, batch_size_starts, batch_size_units): then the batch in force is
// the new train.batch_size, as a fresh run's, and the schedule applies from there; else the
// checkpoint's batch in force and its history go on.
bool batch_keys_changed(const TrainConfig& saved, const TrainConfig& now);

// The batch a run resumed from checkpoint state `state` of a run of `saved` goes on with under
// `config`: the checkpoint's batch in force and history, unless the resume changes the batch's
// keys (batch_keys_changed: then {config's train.batch_size}); both configurations with their
// batch in force (with_batch_size), as resume_position and resumed_max_steps take them.
struct ResumedBatch {
  std::vector<int64_t> history;
  RunConfig saved_in_force;
  RunConfig in_force;
};
ResumedBatch resumed_batch(const RunConfig& saved, const TrainerState& state,
                           const RunConfig& config);

// OLMo-core's initial_lr after the sizes in `history` (the first: train.batch_size), each change
// multiplying it by sqrt(new / old) in the order they were made, as its callback does: lr itself
// for a history of one.
double scheduled_initial_lr(double lr, std::span<const int64_t> history);

// A change of the batch size before the update after `step`.
struct BatchSizeChange {
  int64_t from = 0;  // sequences
  int64_t to = 0;
  RunConfig config;         // with_batch_size(config, to), its length recounted
  ResumePosition position;  // where the loader goes on (its cursor in the new batches' order)
  ReplayOrigin origin;      // the new batch takes over here (config.train.max_steps: the
                            // run's length in updates after it)
  uint64_t epoch = 1;       // the trainer's epoch the schedule was asked in (epochs' units)
};

// The change one ask of the schedule makes before the update after `step`, if any. `config` holds
// the batch in force (with_batch_size), which took over at `origin`; `history` is the sizes in
// force so far (the length's schedule checks are made at the new initial_lr). `dataset` is the
// training set: needed under data.order = "olmo-core", train.max_epochs and epochs' units (else
// it may be null). `run_ends_here`: the run's last update is done (a run in epochs asks once more
// at its last epoch's end, and no more). A change whose new length the learning-rate schedule
// refuses is a one-line error.
std::optional<BatchSizeChange> scheduled_batch_change(const RunConfig& config, int64_t step,
                                                      const ReplayOrigin& origin,
                                                      std::span<const int64_t> history,
                                                      const data::TokenDataset* dataset,
                                                      bool run_ends_here = false);

// Every change the schedule makes before the update after `step`, in order: OLMo-core asks once a
// batch, and twice at an epoch's end (in the epoch that ended, then after its loader's reset),
// each ask able to change the batch. Each change is of the state the one before it left.
std::vector<BatchSizeChange> scheduled_batch_changes(const RunConfig& config, int64_t step,
                                                     const ReplayOrigin& origin,
                                                     std::span<const int64_t> history,
                                                     const data::TokenDataset* dataset,
                                                     bool run_ends_here = false);

// "batch size: 8 -> 16 sequences before update 101 (train.batch_size_starts[1]=100 steps): ..."
// for the run's output.
std::string describe_batch_size_change(const RunConfig& config, int64_t step,
                                       const BatchSizeChange& change,
                                       std::span<const int64_t> history_after);

}  // namespace moecore
