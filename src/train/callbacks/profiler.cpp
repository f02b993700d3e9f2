#include "train/callbacks/profiler.h"

#include <fmt/format.h>

#include "core/phase_timer.h"
#include "io/file_util.h"
#include "train/callbacks/rank_stats.h"
#include "train/profile_report.h"
#include "train/train_context.h"

namespace moecore {

void ProfilerCallback::on_start(TrainContext& ctx) {
  phase_timer::set_enabled(ctx.config.train.profile);
}

void ProfilerCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  if (!ctx.config.train.profile) return;
  // On a device, the step's phases are timed once the device has run them: collected here, at
  // the end of every step, so that their marks do not pile up over a run.
  phase_timer::collect_device();
  if (report.step != ctx.summary.start_step + 1) return;
  phase_timer::reset();
  start_seconds_ = report.seconds;
  host_reads_.emplace();
}

void ProfilerCallback::on_end(TrainContext& ctx) {
  if (!ctx.config.train.profile) return;
  phase_timer::set_enabled(false);
  const std::vector<HostRead> reads = host_reads_ ? host_reads_->reads() : std::vector<HostRead>{};
  host_reads_.reset();
  const int64_t profiled = ctx.step - ctx.summary.start_step - 1;
  const double seconds = ctx.seconds() - start_seconds_;
  const std::string report = profile_report_json(profiled, seconds, reads);
  // Every rank's own phases beside its rank_stats (a pipeline's stages differ: the slowest is
  // not always rank 0's); rank 0's is also the run's profile.json.
  const std::string& out_dir = ctx.config.train.out_dir;
  io::write_text_atomic(
      fmt::format("{}/profile_rank{}.json", rank_stats_dir(out_dir), ctx.world.rank()), report,
      "[train]");
  if (ctx.world.rank() != 0) return;
  io::write_text_atomic(out_dir + "/profile.json", report, "[train]");
  ctx.progress.message(profile_report_line(profiled, seconds, reads));
}

}  // namespace moecore
