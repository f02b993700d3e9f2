// OLMo-core's StabilityMonitorCallback: a step is a spike when its cross-entropy or its gradient
// norm (before clipping) exceeds the mean of the last `window` values before it by more than
// `threshold_std` standard deviations (the population's; none until `window` values are kept, nor
// where the deviation is below 1e-10), in its arithmetic (double sums in order). Reported: the
// spike rate over the last `rolling_window` steps once that many are kept (its "spike/SpikeScore"),
// and over every step so far once `window` steps are counted ("spike/SpikeScore (total)").
// A step whose loss or norm is not finite (which OLMo-core's trainer stops on, and moecore's step
// guard skips) is left out. The state travels in the checkpoint, so a resumed run reports what the
// uninterrupted one does.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>

namespace moecore {

struct SpikeMonitorConfig {
  bool enabled = false;
  int64_t window = 128;
  int64_t rolling_window = 10000;
  double threshold_std = 6.0;
};

class SpikeMonitor {
 public:
  explicit SpikeMonitor(const SpikeMonitorConfig& config) : config_(config) {}

  struct Scores {
    bool spike = false;
    std::optional<double> running, total;  // reported once their windows are full
  };
  Scores observe(double ce_loss, double grad_norm);

  nlohmann::json to_json() const;
  // A checkpoint's state (checked by train/trainer_state.cpp); windows longer than this run's are
  // cut to their newest values.
  void from_json(const nlohmann::json& state);

 private:
  bool is_spike(double value, const std::deque<double>& history) const;

  SpikeMonitorConfig config_;
  std::deque<double> losses_, grad_norms_;
  std::deque<bool> spikes_;
  int64_t total_spikes_ = 0, total_steps_ = 0;
};

}  // namespace moecore
