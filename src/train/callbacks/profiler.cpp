#include "train/callbacks/profiler.h"

#include "core/phase_timer.h"
#include "io/file_util.h"
#include "train/profile_report.h"
#include "train/train_context.h"

namespace moecore {

void ProfilerCallback::on_start(TrainContext& ctx) {
  phase_timer::set_enabled(ctx.config.train.profile);
}

void ProfilerCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  if (!ctx.config.train.profile || report.step != ctx.summary.start_step + 1) return;
  phase_timer::reset();
  start_seconds_ = report.seconds;
}

void ProfilerCallback::on_end(TrainContext& ctx) {
  if (!ctx.config.train.profile || ctx.world.rank() != 0) return;
  phase_timer::set_enabled(false);
  const int64_t profiled = ctx.step - ctx.summary.start_step - 1;
  const double seconds = ctx.seconds() - start_seconds_;
  io::write_text_atomic(ctx.config.train.out_dir + "/profile.json",
                        profile_report_json(profiled, seconds), "[train]");
  ctx.progress.message(profile_report_line(profiled, seconds));
}

}  // namespace moecore
