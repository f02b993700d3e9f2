#include "train/callbacks/peak_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <vector>

#include "train/train_context.h"

namespace moecore {

void PeakMemoryCallback::on_end(TrainContext& ctx) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // KiB on Linux
  double peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  ctx.mesh.dp.allreduce_max(&peak_mib, 1);
  const int64_t pp = ctx.config.parallel.pp;
  std::vector<int64_t> stage_peak_kib(static_cast<size_t>(pp));
  const int64_t my_peak_kib = static_cast<int64_t>(peak_mib * 1024.0);
  ctx.mesh.pp.allgather(&my_peak_kib, stage_peak_kib.data(), 1);
  ctx.world.allreduce_max(&peak_mib, 1);
  std::string per_stage;
  if (pp > 1) {
    for (int64_t kib : stage_peak_kib)
      per_stage +=
          fmt::format("{}{:.1f}", per_stage.empty() ? "" : ", ", static_cast<double>(kib) / 1024.0);
    per_stage = fmt::format("; per stage [{}] MiB", per_stage);
  }
  ctx.peak_memory = fmt::format("peak RSS {:.1f} MiB per rank (max over {} ranks){}", peak_mib,
                                ctx.world.size(), per_stage);
}

}  // namespace moecore
