// Decides whether an optimizer step may be applied (OLMo-core's skip-step idea): a step whose loss
// or gradient norm is NaN/Inf is always skipped; a step whose loss or gradient norm exceeds the
// rolling mean of a window of earlier steps by more than `sigma` standard deviations is a spike and
// is skipped too. The weights never take a skipped update. Two rules for the window:
// - kMoecore (the default): the last `window` healthy steps, judged once `min_window` are known,
//   population standard deviation floored at 1% of the mean; skipped steps never enter the window,
//   so one spike cannot widen the band for the next.
// - kOlmoCore: OLMo-core's SkipStepOptimizer (get_step_factor): the last `window` steps, skipped
//   ones included, judged from the step that makes max(2, window / 2) values with its own, sample
//   standard deviation (n - 1), no floor. Non-finite steps are skipped and not recorded (OLMo-core
//   stops the run on them instead). The trainer judges the cross-entropy there, as OLMo-core does.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>

namespace moecore {

enum class SkipRule { kMoecore, kOlmoCore };

struct StepGuardConfig {
  double sigma = 6.0;  // <= 0: only non-finite steps are skipped
  int64_t window = 128;
  int64_t min_window = 20;  // kMoecore only
  SkipRule rule = SkipRule::kMoecore;
};

// The largest loss and gradient norm the next step may have (+inf: no limit yet): beyond either,
// or not finite, it is skipped.
struct StepLimits {
  double loss, grad_norm;
};

class StepGuard {
 public:
  explicit StepGuard(const StepGuardConfig& config) : config_(config) {}

  // For a decision made where the gradients are, before the host knows the step's loss and norm
  // (kernels::step_decision): check() then decides the same from the same values.
  StepLimits limits() const;
  // Returns an empty string when the step is healthy (and records it), otherwise the reason.
  std::string check(double loss, double grad_norm);

  int64_t skipped() const { return skipped_; }
  // Steps skipped since the last applied one, and why the latest of them was.
  int64_t consecutive_skips() const { return consecutive_; }
  const std::string& last_skip_reason() const { return last_reason_; }
  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& state);

 private:
  StepGuardConfig config_;
  std::deque<double> losses_, grad_norms_;
  int64_t skipped_ = 0;
  int64_t consecutive_ = 0;
  std::string last_reason_;
};

}  // namespace moecore
