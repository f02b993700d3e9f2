// Validation during training: every train.eval_every steps (not on the last step, nor when the run
// is stopping early) and once at the end (unless a stop signal ended the run: a preemption's grace
// period is short), the validation loss over train.eval_batches batches (train/evaluate.h),
// reported to the other callbacks (metrics.jsonl, the console) and as the run's val_loss, the
// labelled sets' metrics (data.lm_eval: train/lm_evaluator.h) and the downstream tasks' metrics
// (train.downstream_tasks: train/downstream_eval.h), as OLMo-core's LM and downstream evaluator
// callbacks. An evaluation a stop signal cancelled is recorded in the
// checkpoint and made up by the resumed run before its first step.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "data/icl_task.h"
#include "data/padded_documents.h"
#include "data/token_dataset.h"
#include "train/callback.h"

namespace moecore {

// Whether this rank runs the validation loss: dp rank 0 (with its pipeline stages) alone, the
// data-parallel reduction off; with expert parallelism every rank (the same batches together).
bool evaluates_validation_loss(const TrainContext& ctx);
// Whether this rank takes part in the run's evaluations: the validation loss's ranks, and every
// data-parallel rank when labelled sets or downstream tasks spread their passes over them.
bool takes_part_in_evaluation(const TrainContext& ctx);

class EvalCallback final : public Callback {
 public:
  // val_data, lm_eval: nullptr when the run has none; lm_documents: the documents of lm_eval each
  // evaluation scores (lm_eval_documents).
  EvalCallback(const data::TokenDataset* val_data, const data::PaddedDocuments* lm_eval,
               std::vector<int64_t> lm_documents, std::vector<data::IclTask> downstream)
      : val_data_(val_data),
        lm_eval_(lm_eval),
        lm_documents_(std::move(lm_documents)),
        downstream_(std::move(downstream)) {}
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_end(TrainContext& ctx) override;
  // TrainContext::evaluate_merged: everything evaluated (the labelled sets and the tasks whatever
  // train.lm_eval_every and train.downstream_eval_every say), reported as merged.
  void evaluate_merged(TrainContext& ctx, int64_t step) {
    evaluate_at(ctx, step, /*final=*/false, /*merged=*/true);
  }

 private:
  // Collective; the result on rank 0 (loss only with validation data). The run's last evaluation
  // (`final`) and a merged one score the labelled sets and the downstream tasks whatever
  // train.lm_eval_every and train.downstream_eval_every say.
  EvalResult evaluate_at(TrainContext& ctx, int64_t step, bool final, bool merged = false);
  // Every downstream task's metrics, on rank 0 (which prints each task's first); called by the
  // ranks that evaluate.
  io::MetricsSink::Scalars evaluate_downstream(TrainContext& ctx, int64_t step, bool merged);
  // The labelled sets' metrics, on rank 0 (which prints them); called by the ranks that evaluate.
  io::MetricsSink::Scalars evaluate_lm(TrainContext& ctx, int64_t step, bool merged);

  const data::TokenDataset* val_data_;
  const data::PaddedDocuments* lm_eval_;
  std::vector<int64_t> lm_documents_;
  std::vector<data::IclTask> downstream_;
};

}  // namespace moecore
