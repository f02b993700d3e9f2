// How a run reads its training set: data.order's rule over train.seed, global batches of
// train.batch_size, each micro-batch dealt to the data-parallel ranks (data/token_dataset.h).
// The trainer, `moecore dump` and `moecore data order` all read through it.
#pragma once

#include <cstdint>

#include "data/token_dataset.h"
#include "train/run_config.h"

namespace moecore {

// A loader at `cursor` (instances read since the run began) for `dp_ranks` data-parallel ranks.
data::DataLoader training_loader(const RunConfig& config, const data::TokenDataset& dataset,
                                 uint64_t cursor = 0, int64_t dp_ranks = 1);

}  // namespace moecore
