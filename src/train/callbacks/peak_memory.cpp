#include "train/callbacks/peak_memory.h"

#include <fmt/format.h>

#include <vector>

#include "core/host_memory.h"
#include "train/train_context.h"

namespace moecore {

void PeakMemoryCallback::on_end(TrainContext& ctx) {
  double peak_mib = static_cast<double>(peak_resident_kib()) / 1024.0;
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
