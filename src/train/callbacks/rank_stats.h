// out_dir/rank_stats/rank<r>.json when the steps are over: this rank's traffic per collective
// over the training loop and its peak resident memory at the loop's end (before the final
// checkpoint, evaluation and sample), what `moecore plan` predicts (bench/plan_validation.py
// compares them).
#pragma once

#include <string>

#include "train/callback.h"

namespace moecore {

// out_dir/rank_stats, created if missing (one-line error if it cannot be): the per-rank
// diagnostics' directory, also holding each rank's profile (callbacks/profiler.h).
std::string rank_stats_dir(const std::string& out_dir);
inline constexpr const char* kRankStatsSubdir = "rank_stats";

class RankStatsCallback final : public Callback {
 public:
  void on_start(TrainContext& ctx) override;
  void on_end(TrainContext& ctx) override;

 private:
  int64_t first_step_ = 0;
};

}  // namespace moecore
