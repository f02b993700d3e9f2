// train.profile: the phases of the step (core/phase_timer.h) timed from the end of the first step
// (allocation, first touch) on; at the end rank 0 prints a `profile:` line and writes
// out_dir/profile.json (train/profile_report.h).
#pragma once

#include "train/callback.h"

namespace moecore {

class ProfilerCallback final : public Callback {
 public:
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;

 private:
  double start_seconds_ = 0.0;  // of the timed window
};

}  // namespace moecore
