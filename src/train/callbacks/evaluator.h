// Validation during training: every train.eval_every steps (not on the last step, nor when the run
// is stopping early) and once at the end (unless a stop signal ended the run: a preemption's grace
// period is short), the validation loss over train.eval_batches batches (train/evaluate.h),
// reported to the other callbacks (metrics.jsonl, the console) and as the run's val_loss, and the
// downstream tasks' metrics (train.downstream_tasks: train/downstream_eval.h), as OLMo-core's
// LM and downstream evaluator callbacks. An evaluation a stop signal cancelled is recorded in the
// checkpoint and made up by the resumed run before its first step.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "data/icl_task.h"
#include "data/token_dataset.h"
#include "train/callback.h"

namespace moecore {

class EvalCallback final : public Callback {
 public:
  // val_data: nullptr when the run has none (downstream tasks only).
  EvalCallback(const data::TokenDataset* val_data, std::vector<data::IclTask> downstream)
      : val_data_(val_data), downstream_(std::move(downstream)) {}
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;
  // TrainContext::evaluate_merged: everything evaluated (the tasks whatever
  // train.downstream_eval_every says), reported as merged.
  void evaluate_merged(TrainContext& ctx, int64_t step) {
    evaluate_at(ctx, step, /*final=*/false, /*merged=*/true);
  }

 private:
  // Collective; the result on rank 0 (loss only with validation data). The run's last evaluation
  // (`final`) and a merged one score the downstream tasks whatever train.downstream_eval_every
  // says.
  EvalResult evaluate_at(TrainContext& ctx, int64_t step, bool final, bool merged = false);
  // Every downstream task's metrics, on rank 0 (which prints each task's first); called by the
  // ranks that evaluate.
  io::MetricsSink::Scalars evaluate_downstream(TrainContext& ctx, int64_t step, bool merged);

  const data::TokenDataset* val_data_;
  std::vector<data::IclTask> downstream_;
};

}  // namespace moecore
