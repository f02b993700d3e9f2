// OLMo-core's SequenceLengthSchedulerCallback: a sequence-length warm-up over the first
// train.seq_len_warmup_steps updates, from train.seq_len_warmup_min to train.seq_len. The loader
// reads the run's instances of seq_len tokens as always (the tokens seen count them whole, as
// OLMo-core's trainer does); before an update of the warm-up its batch is cut, as the callback's
// pre_step cuts it:
//   * melt (the default): each instance is split into seq_len / L consecutive rows of L tokens,
//     L = min x 2^floor(log2((min + (seq_len - min) x step / warmup) // min)) (its
//     _get_split_sequence_length), each row's last target ignored as OLMo-core's labels are;
//   * truncate (train.seq_len_warmup_truncate): each instance keeps its first L tokens, L the
//     linear warm-up rounded down to a multiple of train.seq_len_warmup_multiple, the rest of
//     its tokens unread.
// Each rank's cut batch is then split into micro-batches as OLMo-core's train module splits it:
// of rank_microbatch_size // L rows, its rank_microbatch_size (the micro-batch's tokens) multiplied
// by the number of rows an instance became when melting (the callback does; a micro-batch then
// holds that many times the tokens). moecore's passes take micro-batches of one size: a warm-up
// step whose split leaves a smaller last micro-batch is refused before the run starts.
#pragma once

#include <cstdint>
#include <vector>

#include "train/run_config.h"

namespace moecore {

// The sequence length OLMo-core trains update `step` (1-based) at: the warm-up's below
// train.seq_len_warmup_steps, train.seq_len from there (none: seq_len throughout).
int64_t warmup_seq_len(const TrainConfig& t, int64_t step);

// How update `step` cuts each rank's batch of `microbatches` micro-batches of `local_rows`
// instances: into rows of `seq` tokens, `pieces` of them an instance (melt: seq_len / seq;
// truncate: 1), in `micro` micro-batches of `rows` rows each. Outside the warm-up the batch as it
// is (pieces 1, the run's micro-batches). A split into micro-batches of unequal size is a
// one-line error.
struct WarmupShape {
  int64_t seq = 0;
  int64_t pieces = 1;
  int64_t micro = 0;
  int64_t rows = 0;
  bool cut = false;  // the batch is cut (seq < seq_len)
};
WarmupShape warmup_shape(const TrainConfig& t, int64_t microbatches, int64_t local_rows,
                         int64_t step);

// The warm-up's updates by length: [first, last] (1-based) train rows of `seq` tokens; in
// order, the lengths rising. Empty without a warm-up. Each length is found once (a binary search
// finds where it ends), however long the warm-up.
struct WarmupSpan {
  int64_t first = 0;
  int64_t last = 0;
  int64_t seq = 0;
};
std::vector<WarmupSpan> warmup_spans(const TrainConfig& t);

// Every warm-up update's split for `dp` data-parallel ranks, at each batch size of the run
// (train.batch_sizes' or train.batch_size): a one-line error naming the first that is uneven, or
// whose truncation keeps no token. Returns the micro-batch counts the warm-up's updates take
// (the pipeline's schedule must hold each). Each length is checked once (warmup_spans).
std::vector<int64_t> check_warmup_shapes(const TrainConfig& t, int64_t dp);

// Update `step`'s cut of a rank's instances: `tokens` and `targets` hold its instances' rows of
// seq_len, in order; `out_tokens` and `out_targets` get the shape's rows, each row's last target
// the ignore index.
void cut_for_warmup(const WarmupShape& shape, int64_t seq_len, const int32_t* tokens,
                    const int32_t* targets, int64_t instances, int32_t* out_tokens,
                    int32_t* out_targets);

}  // namespace moecore
