// Early stops that keep the run: a stop signal (SIGTERM, SIGINT, SIGUSR1; train/stop_signals.h)
// or train.max_seconds. Every rank must stop at the same step (the others would wait in the next
// collective): the ranks' clocks differ a little and a signal may reach only some ranks, so after
// each step the ranks vote and the first to run out of time or to get a signal stops them all.
// The loop then skips the evaluation, saves a checkpoint and ends.
#pragma once

#include "train/callback.h"
#include "train/stop_signals.h"

namespace moecore {

class StopSignalCallback final : public Callback {
 public:
  void on_step_end(TrainContext& ctx, StepReport& report) override;

 private:
  const StopSignals signals_;  // from construction on, a stop signal is recorded
};

}  // namespace moecore
