#include "train/callbacks/stop_signals.h"

#include <fmt/format.h>

#include "train/train_context.h"

namespace moecore {

void StopSignalCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  const double max_seconds = ctx.config.train.max_seconds;
  double votes[2] = {max_seconds > 0.0 && report.seconds >= max_seconds ? 1.0 : 0.0,
                     static_cast<double>(signals_.received())};
  if (ctx.world.size() > 1) ctx.world.allreduce_max(votes, 2);
  ctx.out_of_time = votes[0] > 0.0;
  ctx.stop_signal = static_cast<int>(votes[1]);
  // train.checkpoint=false: nothing is saved, so there is nothing to resume.
  const char* resume = ctx.config.train.checkpoint
                           ? " with a checkpoint (resume with --resume)"
                           : " without a checkpoint (train.checkpoint=false)";
  if (ctx.stop_signal != 0)
    ctx.stop_message = fmt::format("{} received: stopping at step {}{}",
                                   stop_signal_name(ctx.stop_signal), report.step, resume);
  else if (ctx.out_of_time)
    ctx.stop_message =
        fmt::format("train.max_seconds={} reached at step {}: stopping{}", max_seconds, report.step,
                    ctx.config.train.checkpoint ? " (resume with --resume)" : "");
}

void LateStopSignalCallback::on_end(TrainContext& ctx) {
  // The signal the loop stopped for was handled (the run saved; the evaluation is skipped and the
  // process ends with 128 + it).
  if (ctx.stop_signal != 0) {
    loop_.signals().disarm();
    return;
  }
  // Agreed while still armed: a rank reaches this collective only once rank 0 is past the final
  // checkpoint's commit, so a rank that returned from the save early (every rank but 0) keeps
  // recording until then instead of dying while rank 0 commits.
  double late = static_cast<double>(loop_.signals().received());
  if (ctx.world.size() > 1) ctx.world.allreduce_max(&late, 1);
  const int now = loop_.signals().disarm();  // any later one ends the process when it comes
  if (late != 0.0) end_process_by(static_cast<int>(late));
  if (now != 0) end_process_by(now);  // came between the agreement and the disarming
}

}  // namespace moecore
