// MoE diagnostics after every step (OLMo-core's MoE metrics): per layer and aggregated expert
// loads, imbalance, router entropy and the rowwise dispatch's drop rate, read from the model's own
// state of the step's last micro-batch; and the token-gerrymandering detector on the load-balancing
// loss against the measured imbalance.
#pragma once

#include "train/callback.h"

namespace moecore {

class MoeMonitorCallback final : public Callback {
 public:
  void on_step_end(TrainContext& ctx, StepReport& report) override;
};

}  // namespace moecore
