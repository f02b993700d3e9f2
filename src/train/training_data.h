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

// A loader at `cursor` (instances read since the run began) for `dp_ranks` data-parallel ranks.
data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor = 0, int64_t dp_ranks = 1);

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

// The start-up note of a moved position: "note: data.order = "olmo-core" with ...".
std::string describe_resume_position(const RunConfig& saved, const RunConfig& config,
                                     const ResumePosition& position);

}  // namespace moecore
