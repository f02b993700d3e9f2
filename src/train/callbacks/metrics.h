// The step's metrics where people read them: rank 0 writes every scalar of the step (and each
// evaluation's loss) to metrics.jsonl and TensorBoard (io/metrics_sink.h), and every rank passes
// the step to the progress display (which prints on rank 0 only).
#pragma once

#include <optional>

#include "io/metrics_sink.h"
#include "train/callback.h"

namespace moecore {

class MetricsCallback final : public Callback {
 public:
  // Rank 0 opens the run's metrics files, cut back to `resume_step` (a resumed run's checkpoint,
  // 0 for a fresh one).
  MetricsCallback(const std::string& out_dir, int64_t resume_step, bool rank0);
  void on_step_end(TrainContext& ctx, StepReport& report) override;
  void on_eval(TrainContext& ctx, int64_t step, const EvalResult& result) override;
  void on_end(TrainContext& ctx) override;

 private:
  std::optional<io::MetricsSink> sink_;  // rank 0
};

}  // namespace moecore
