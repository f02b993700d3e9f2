// Validation during training: every train.eval_every steps (not on the last step, nor when the run
// is stopping early) and once at the end (unless a stop signal ended the run: a preemption's grace
// period is short), the validation loss over train.eval_batches batches (train/evaluate.h),
// reported to the other callbacks (metrics.jsonl, the console) and as the run's val_loss. An
// evaluation a stop signal cancelled is recorded in the checkpoint and made up by the resumed run
// before its first step.
#pragma once

#include <cstdint>

#include "data/token_dataset.h"
#include "train/callback.h"

namespace moecore {

class EvalCallback final : public Callback {
 public:
  explicit EvalCallback(const data::TokenDataset& val_data) : val_data_(val_data) {}
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;

 private:
  double evaluate_at(TrainContext& ctx, int64_t step);  // collective; the loss on rank 0

  const data::TokenDataset& val_data_;
};

}  // namespace moecore
