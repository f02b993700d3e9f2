#include "train/callbacks/rank_stats.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/host_memory.h"
#include "dist/traffic_counters.h"
#include "io/file_util.h"
#include "train/train_context.h"

namespace moecore {

std::string rank_stats_dir(const std::string& out_dir) {
  const std::string dir = out_dir + "/" + kRankStatsSubdir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MOE_CHECK(!ec, "[train] cannot create {}: {}", dir, ec.message());
  return dir;
}

void RankStatsCallback::on_start(TrainContext& ctx) {
  first_step_ = ctx.step;
  dist::reset_traffic_counters();  // what the steps move
}

void RankStatsCallback::on_end(TrainContext& ctx) {
  nlohmann::json traffic = nlohmann::json::object();
  for (const auto& [key, count] : dist::traffic_counters())
    traffic[key] = {{"bytes", count.bytes}, {"calls", count.calls}};
  const int rank = ctx.world.rank();
  const nlohmann::json stats = {{"rank", rank},
                                {"stage", ctx.mesh.stage()},
                                {"steps", ctx.step - first_step_},
                                {"peak_rss_kib", peak_resident_kib()},
                                {"traffic", traffic}};
  // Atomic as every file of a run: a full disk leaves the previous run's file whole, and the
  // error names its cause.
  io::write_text_atomic(
      fmt::format("{}/rank{}.json", rank_stats_dir(ctx.config.train.out_dir), rank),
      stats.dump(1) + '\n', "[train]");
}

}  // namespace moecore
