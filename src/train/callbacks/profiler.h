// train.profile: the phases of the step (core/phase_timer.h) timed, and the host's reads of
// device memory logged (core/device_memory.h), from the end of the first step (allocation, first
// touch) on; at the end rank 0 prints a `profile:` line and writes out_dir/profile.json
// (train/profile_report.h).
#pragma once

#include <optional>

#include "core/device_memory.h"
#include "train/callback.h"

namespace moecore {

class ProfilerCallback final : public Callback {
 public:
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;

 private:
  double start_seconds_ = 0.0;  // of the timed window
  std::optional<HostReadLog> host_reads_;
};

}  // namespace moecore
