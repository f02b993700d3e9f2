// Early stops that keep the run: a stop signal (SIGTERM, SIGINT, SIGUSR1; train/stop_signals.h)
// or train.max_seconds. Every rank must stop at the same step (the others would wait in the next
// collective): the ranks' clocks differ a little and a signal may reach only some ranks, so after
// each step the ranks vote and the first to run out of time or to get a signal stops them all.
// The loop then skips the evaluation, saves a checkpoint and ends.
//
// After the loop the final checkpoint is saved under the same protection (a signal during the
// save is recorded), and then the process is past the point where a stop can keep anything: the
// final evaluation and the sample end on a stop signal as at any time outside the loop (a
// preempted job must not outlive its grace period). LateStopSignalCallback does that; its on_end
// must run right after the checkpoint's and before the evaluation's (add_callbacks puts it there;
// StopSignalCallback's place is before the evaluation in step order, so the two cannot be one).
#pragma once

#include "train/callback.h"
#include "train/stop_signals.h"

namespace moecore {

class StopSignalCallback final : public Callback {
 public:
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  StopSignals& signals() { return signals_; }

 private:
  StopSignals signals_;  // from construction on, a stop signal is recorded
};

// A stop signal received after the loop's last vote (during the final save) ends the process
// once the save is done, on every rank (they agree first, so that rank 0 has committed the
// checkpoint); any later one ends it when it comes.
class LateStopSignalCallback final : public Callback {
 public:
  explicit LateStopSignalCallback(StopSignalCallback& loop) : loop_(loop) {}
  void on_end(TrainContext& ctx) override;

 private:
  StopSignalCallback& loop_;
};

}  // namespace moecore
