// The training loop on a byte-level text corpus: sample a batch, forward, backward, clip, AdamW,
// log; evaluate on the validation tail every eval_every steps; save the weights at the end.
#pragma once

#include "train/run_config.h"

namespace moecore {

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0.0;
  double last_loss = 0.0;
  double val_loss = 0.0;
};

TrainSummary train(const RunConfig& config);

}  // namespace moecore
