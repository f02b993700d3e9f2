// How a run reads its training set: data.order's rule over train.seed, global batches of
// train.batch_size, each micro-batch dealt to the data-parallel ranks (data/token_dataset.h).
// The trainer, `moecore dump` and `moecore data order` all read through it, and a resumed run
// starts where resume_position says (the trainer and `data order --resume` alike).
#pragma once

#include <cstdint>
#include <string>

#include "data/token_dataset.h"
#include "train/run_config.h"
#include "train/trainer_state.h"

namespace moecore {

// data.train cut into instances as the run cuts them (train.seq_len, data.dtype,
// data.max_target_seq_len).
data::TokenDataset open_training_set(const RunConfig& config);

// The instances an epoch of `instances` visits under `config`'s order and batch (data/
// instance_order.h: all of them under moecore's order, OLMo-core's whole global batches).
int64_t epoch_length(const RunConfig& config, int64_t instances);

// A loader at `cursor` (instances read since the run began) for `dp_ranks` data-parallel ranks,
// masking as data.instance_filter says.
data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor = 0, int64_t dp_ranks = 1);

// The run's length in updates under train.max_epochs (OLMo-core's Trainer.max_steps under
// max_duration = Duration.epochs(n)): from `origin_step` and `origin_cursor` (where the current
// batch size took over: the replay origin's step and data cursor; 0 and 0 for a fresh run), the
// updates until the data cursor reaches max_epochs x the order's epoch length (OLMo-core's order:
// its whole global batches, so exactly its count, the remaining batches of the epoch and those of
// the later ones; moecore's: every instance, the last batch running into the next epoch), none
// past it. An epoch without a whole batch or a count that overflows is a one-line error.
int64_t max_steps_for_epochs(const RunConfig& config, const data::TokenDataset& dataset,
                             int64_t origin_step = 0, uint64_t origin_cursor = 0);

// The step the run's loop ends at (run_config.h's last_step), from where the batch in force took
// over (`origin`): with train.hard_stop_epochs, the updates until the data cursor reaches that
// many epochs of `dataset`, as max_steps_for_epochs counts a length, if they end before
// train.max_steps.
int64_t last_step_with_data(const RunConfig& config, const data::TokenDataset& dataset,
                            const ReplayOrigin& origin);

// Where a resumed run's loader starts.
struct ResumePosition {
  uint64_t cursor = 0;  // the loader's cursor in the resumed run
  // Under OLMo-core's order (saved and now) the fields below say where OLMo-core's loader goes on
  // (zero under moecore's); `moved`: another batch size or seq_len, or a cursor that moved.
  bool moved = false;
  uint64_t epoch = 0;        // the epoch the run goes on in, from 1 as OLMo-core counts
  int64_t offset = 0;        // the instances of that epoch before the new cursor
  int64_t epoch_length = 0;  // the instances that epoch visits under the new settings
  int64_t tokens_read = 0;   // the tokens OLMo-core's loader counts as read of that epoch
  int64_t read_again = 0;    // instances of it read before the resume and again after it
};

// The saved cursor under moecore's order. Under data.order = "olmo-core" (saved and now) the run
// does as OLMo-core's NumpyFSLDataLoader.load_state_dict: it stays in the epoch it was in (at an
// epoch's end the one that ended, since OLMo-core checkpoints a step before it resets its epoch)
// and restarts it after as many whole global batches of the current size as the tokens it had
// read there fill (batches_processed = tokens_processed // global batch tokens). Under unchanged
// settings that is the saved cursor; with another batch size the instances read past those
// batches are read again, with another seq_len the instances are cut anew and the position is
// one of tokens, and tokens that filled no whole batch still count in that epoch (the replay
// origin records them: a second change in the same epoch starts where OLMo-core's would).
// `saved` and `state` are checkpoint `checkpoint`'s (named in errors), `instances` this run's
// training instances. Another seq_len needs the saved run's instance count, which checkpoints of
// older moecore do not record, and another train.seed OLMo-core's loader would ignore (it keeps
// the checkpoint's): one-line errors.
ResumePosition resume_position(const RunConfig& saved, const TrainerState& state,
                               const std::string& checkpoint, const RunConfig& config,
                               int64_t instances);

// Where OLMo-core's loader stands at checkpoint-like state `state` under `config`'s batch and
// order (data.order = "olmo-core"; `instances`: the training set's): the whole global batches it
// has read of its epoch (its batches_processed, tokens_processed // global batch tokens) and
// whether that epoch is read to its end (its next batch is the next epoch's first).
struct OlmoCoreEpochPosition {
  int64_t batches = 0;
  bool epoch_done = false;
};
OlmoCoreEpochPosition olmo_core_epoch_position(const RunConfig& config, const TrainerState& state,
                                               int64_t instances);

// Where the batch in force of a run resumed from checkpoint state `state` took over: the
// checkpoint's replay origin, or, where the resume changes the replay (`changed`), the
// checkpoint's step and tokens with the loader at `position` (a new origin starts there; in
// tokens, schedule_origin's). A fresh run's (a default state): zero.
ReplayOrigin resumed_replay_origin(const TrainerState& state, bool changed,
                                   const ResumePosition& position);

// The start-up note of a moved position: "note: data.order = "olmo-core" with ...".
std::string describe_resume_position(const RunConfig& saved, const RunConfig& config,
                                     const ResumePosition& position);

// A run resumed from checkpoint `checkpoint` (its `saved` config and `state`) with `config`
// (`changed`: another replay configuration, so a new origin starts there): its length in updates,
// OLMo-core's Trainer.max_steps. train.max_steps; under train.max_tokens the updates until the
// tokens seen reach it, from the schedule's origin; under train.max_epochs those until the data
// cursor reaches its epochs of `dataset` (required then), from the replay origin's cursor or,
// changed, from `position`'s. A checkpoint whose update before its last had already reached
// max_tokens or max_epochs (in the saved run's count) is past the run: a one-line error under
// `tag`, as one past train.max_steps is.
int64_t resumed_max_steps(const RunConfig& saved, const TrainerState& state,
                          const std::string& checkpoint, const RunConfig& config, bool changed,
                          const data::TokenDataset* dataset, const ResumePosition& position,
                          const char* tag);

}  // namespace moecore
