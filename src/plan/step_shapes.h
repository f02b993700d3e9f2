// The shapes of the updates a run takes, for the planner's memory: an update's micro-batches
// hold `local_rows` rows of `seq_len` tokens on a rank, `microbatches` of them. Most runs take one
// shape; train.batch_sizes adds one per batch size (the micro-batch kept, their count moving) and
// OLMo-core's sequence-length warm-up one per length (train/seq_len_warmup.h: melted, a warm-up
// micro-batch holds up to seq_len / length times the tokens of the run's). The trainer's buffers
// keep the largest size they were given, so a rank's peak is the shapes' together
// (plan/memory_model.h's run_rank_memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

struct StepShape {
  std::string updates;  // which updates take it, in words
  int64_t seq_len = 0;
  int64_t microbatches = 0;
  int64_t local_rows = 0;
  bool cut = false;  // a warm-up's cut batch, held beside the batch as read
  int64_t tokens() const { return microbatches * local_rows * seq_len; }
  bool operator==(const StepShape& o) const {
    return seq_len == o.seq_len && microbatches == o.microbatches && local_rows == o.local_rows &&
           cut == o.cut;
  }
};

// The run's shapes: first the config's own (train.batch_size x seq_len in train.microbatches),
// then the batch schedule's other sizes the run can reach, then each warm-up length at each batch
// size that may be in force by its last update (a start in steps or tokens not reached by then
// leaves the size out; one in epochs, which depends on the data, is counted as if reached).
// Shapes alike are listed once.
std::vector<StepShape> run_step_shapes(const TrainConfig& tc, const ResolvedLayout& layout);

// `config` and `layout` as an update of `shape` sees them (the planner's models read the shape
// from train.seq_len, train.microbatches and the layout's rows).
RunConfig shaped_config(const RunConfig& config, const StepShape& shape,
                        const ResolvedLayout& layout);
ResolvedLayout shaped_layout(const ResolvedLayout& layout, const StepShape& shape);

}  // namespace moecore::plan
