#include "train/callbacks/rank_stats.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "dist/traffic_counters.h"
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
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  nlohmann::json traffic = nlohmann::json::object();
  for (const auto& [key, count] : dist::traffic_counters())
    traffic[key] = {{"bytes", count.bytes}, {"calls", count.calls}};
  const int rank = ctx.world.rank();
  const nlohmann::json stats = {{"rank", rank},
                                {"stage", ctx.mesh.stage()},
                                {"steps", ctx.step - first_step_},
                                {"peak_rss_kib", static_cast<int64_t>(usage.ru_maxrss)},
                                {"traffic", traffic}};
  // A plain write: a diagnostics file, outside the checkpoints' atomic writes and the write-fault
  // test hook (which must fire on a checkpoint).
  const std::string path =
      fmt::format("{}/rank{}.json", rank_stats_dir(ctx.config.train.out_dir), rank);
  std::ofstream out(path, std::ios::trunc);
  out << stats.dump(1) << '\n';
  out.close();
  MOE_CHECK(out.good(), "[train] cannot write {}", path);
}

}  // namespace moecore
