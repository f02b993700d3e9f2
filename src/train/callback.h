// The training loop's extension points, as OLMo-core's trainer callbacks: train() (trainer.cpp)
// runs the steps and calls every callback at fixed points; each callback owns one concern
// (callbacks/: checkpoints, evaluation, metrics, MoE monitoring, profiling, stop signals, memory,
// the sample). Callbacks run in the order they were registered; on_end runs in the reverse order,
// so that what one callback relies on from another (the metrics file an evaluation writes to, the
// checkpoint the sample reads) is torn down after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/metrics_sink.h"
#include "model/transformer.h"
#include "train/evaluate.h"

namespace moecore {

struct TrainContext;

// What one optimizer step produced, handed to every callback in turn. Callbacks add their scalars
// (in the order they reach metrics.jsonl) and their part of the progress line.
struct StepReport {
  int64_t step = 0;  // optimizer steps done, resumed ones included
  LossParts loss;    // of the global batch (summed over the pipeline stages)
  double grad_norm = 0.0;
  double lr = 0.0;
  // Each optimizer group's rate (group 0's is lr; optim.group_overrides' groups after it).
  std::vector<double> group_lrs;
  double seconds = 0.0;       // since the loop began
  double tokens_per_s = 0.0;  // since the loop began
  bool log_step = false;      // a log_every step (or the last): per-expert counts are logged
  io::MetricsSink::Scalars scalars;
  double load_imbalance =
      0.0;  // mean over the MoE layers (the MoE monitor's), for the progress line
};

class Callback {
 public:
  virtual ~Callback() = default;
  // Before the first step of this process.
  virtual void on_start(TrainContext&) {}
  // After each optimizer step (or skipped step).
  virtual void on_step_end(TrainContext&, StepReport&) {}
  // An evaluation finished (rank 0 holds its result; other ranks are not called).
  virtual void on_eval(TrainContext&, int64_t /*step*/, const EvalResult&) {}
  // A checkpoint was committed (rank 0 only: `dir` is its directory).
  virtual void on_checkpoint(TrainContext&, int64_t /*step*/, const std::string& /*dir*/) {}
  // The steps are over, by max_steps, a hard stop, max_seconds or a stop signal (in reverse
  // order).
  virtual void on_end(TrainContext&) {}
};

}  // namespace moecore
