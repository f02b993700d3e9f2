#include "train/callbacks/metrics.h"

#include <fmt/format.h>

#include "train/train_context.h"

namespace moecore {

MetricsCallback::MetricsCallback(const std::string& out_dir, int64_t resume_step, bool rank0) {
  if (rank0) sink_.emplace(out_dir, resume_step);
}

void MetricsCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  if (sink_) sink_->log(report.step, report.scalars);
  const int64_t steps_run = report.step - ctx.summary.start_step;
  ctx.progress.update(report.step, report.loss.ce, report.tokens_per_s,
                      report.seconds / static_cast<double>(steps_run),
                      fmt::format("lb {:.3f}  imb {:.2f}  gnorm {:.2f}  lr {:.1e}", report.loss.lb,
                                  report.load_imbalance, report.grad_norm, report.lr));
}

void MetricsCallback::on_eval(TrainContext& ctx, int64_t step, const EvalResult& result) {
  io::MetricsSink::Scalars scalars;
  if (result.tokens > 0) {  // else the run has no validation data: the other evaluators only
    // The model merger's average (OLMo-core logs it under eval/merged/...).
    const char* prefix = result.merged ? "val/merged/" : "val/";
    scalars = {{std::string(prefix) + "loss", result.loss},
               {std::string(prefix) + "ppl", result.perplexity}};
    ctx.progress.message(
        fmt::format("eval  step {:>6}  {}val_loss {:.4f}  val_ppl {:.2f}  ({} tokens)", step,
                    result.merged ? "merged " : "", result.loss, result.perplexity, result.tokens));
  }
  scalars.insert(scalars.end(), result.downstream.begin(), result.downstream.end());
  scalars.insert(scalars.end(), result.lm.begin(), result.lm.end());
  // The trained weights' evaluation only: a merged one at the same step would log these keys
  // twice.
  if (!result.merged && result.batches > 0) {
    scalars.emplace_back("throughput/in-loop eval time (s)", result.seconds);
    scalars.emplace_back("throughput/in-loop eval batches", static_cast<double>(result.batches));
  }
  if (sink_ && !scalars.empty()) sink_->log(step, scalars);
}

void MetricsCallback::on_end(TrainContext&) {
  if (sink_) sink_->close();
}

}  // namespace moecore
