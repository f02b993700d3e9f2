// "Token gerrymandering" detector (an observation of the OLMo-core MoE work: the load-balancing
// loss keeps improving while the measured load imbalance gets worse, because the router learns to
// spread probability mass, which the loss sees, without spreading tokens, which the hardware sees).
//
// Definition. Over a rolling window of the last W steps, fit a least-squares line to the unscaled
// load-balancing loss lb(t) and to the mean load imbalance imb(t) = mean over MoE layers of
// (max tokens per expert / mean tokens per expert). The relative trend of a series is its fitted
// change across the window divided by its mean over the window: trend = slope * (W - 1) / mean.
// The detector flags gerrymandering when the window is full and
//     trend(lb) <= -threshold   and   trend(imb) >= +threshold,
// i.e. the loss fell and the imbalance rose, each by at least `threshold` (relative) over W steps.
// A warning is printed when the state turns on; it re-arms once the condition clears.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

namespace moecore {

struct GerrymanderingConfig {
  int64_t window = 100;     // steps; 0 disables the detector
  double threshold = 0.05;  // relative change over the window
};

class GerrymanderingDetector {
 public:
  explicit GerrymanderingDetector(const GerrymanderingConfig& config) : config_(config) {}

  struct Verdict {
    bool flagged = false;
    bool newly_flagged = false;  // the state turned on at this step: warn once
    double lb_trend = 0.0;
    double imbalance_trend = 0.0;
  };
  Verdict observe(double lb_loss, double load_imbalance);

  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& state);

 private:
  GerrymanderingConfig config_;
  std::deque<double> lb_, imbalance_;
  bool flagged_ = false;
};

}  // namespace moecore
