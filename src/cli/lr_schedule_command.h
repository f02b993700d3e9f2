// `moecore lr-schedule CONFIG [--set ...] [--every N] [--json] [--resume CHECKPOINT]`: the
// learning rate of every update of the config's run (train.max_steps updates of
// train.batch_size x train.seq_len tokens, or those until train.max_tokens or train.max_epochs),
// as training logs it in train/lr, without training: a
// schedule (a composable's stages, a wsds's periods, a decay tail) can be looked at before a long
// run is started. With --resume, the updates a run resumed from that checkpoint with this config
// makes (after another batch size or seq_len, a schedule in tokens goes on at the tokens seen).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::cli {

struct LrScheduleArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t every = 1;   // print every N-th update (and the first and the last)
  bool json = false;   // one JSON object instead of text
  std::string resume;  // a checkpoint directory: the updates after `train --resume` from it
};

void run_lr_schedule(const LrScheduleArgs& args);

}  // namespace moecore::cli
