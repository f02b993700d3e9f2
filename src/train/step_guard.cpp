#include "train/step_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace moecore {

namespace {

// Mean and standard deviation of the window: population (divided by n) or, as torch.std_mean's
// default that OLMo-core uses, sample (n - 1).
std::pair<double, double> moments(const std::deque<double>& values, bool sample) {
  double mean = 0.0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  double var = 0.0;
  for (double v : values) var += (v - mean) * (v - mean);
  const double n = static_cast<double>(values.size());
  return {mean, std::sqrt(var / (sample ? n - 1.0 : n))};
}

// The window's mean and spread of `values`. moecore's rule floors the spread at 1% of the mean: a
// window of near-identical values would otherwise call every tiny rise a spike, and skipped steps
// never enter the window to widen it again. OLMo-core's has no floor (its skipped steps do enter).
std::pair<double, double> band(const std::deque<double>& values, SkipRule rule) {
  if (rule == SkipRule::kOlmoCore) return moments(values, true);
  const auto [mean, spread] = moments(values, false);
  return {mean, std::max(spread, 0.01 * std::abs(mean))};
}

}  // namespace

StepLimits StepGuard::limits() const {
  constexpr double kNone = std::numeric_limits<double>::infinity();
  const auto known = static_cast<int64_t>(losses_.size());
  // OLMo-core judges once its list, the step's own value included, holds max(2, window / 2).
  const bool judged = config_.rule == SkipRule::kOlmoCore
                          ? known + 1 >= std::max<int64_t>(2, config_.window / 2)
                          : known >= config_.min_window;
  if (config_.sigma <= 0.0 || !judged || known == 0) return {kNone, kNone};
  const auto [loss_mean, loss_std] = band(losses_, config_.rule);
  const auto [norm_mean, norm_std] = band(grad_norms_, config_.rule);
  return {loss_mean + config_.sigma * loss_std, norm_mean + config_.sigma * norm_std};
}

std::string StepGuard::check(double loss, double grad_norm) {
  std::string reason;
  const StepLimits limit = limits();
  if (!std::isfinite(loss)) {
    reason = fmt::format("loss is {}", loss);
  } else if (!std::isfinite(grad_norm)) {
    reason = fmt::format("gradient norm is {}", grad_norm);
  } else if (!(loss <= limit.loss)) {  // step_decision's test: a NaN limit skips too
    const auto [mean, spread] = band(losses_, config_.rule);
    reason = fmt::format("loss spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", loss, mean,
                         config_.sigma, spread);
  } else if (!(grad_norm <= limit.grad_norm)) {
    const auto [mean, spread] = band(grad_norms_, config_.rule);
    reason = fmt::format("gradient-norm spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", grad_norm,
                         mean, config_.sigma, spread);
  }
  // The window takes the healthy steps, and under OLMo-core's rule the finite spikes too.
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  if (reason.empty() || (config_.rule == SkipRule::kOlmoCore && finite)) {
    losses_.push_back(loss);
    grad_norms_.push_back(grad_norm);
    while (static_cast<int64_t>(losses_.size()) > config_.window) {
      losses_.pop_front();
      grad_norms_.pop_front();
    }
  }
  if (!reason.empty()) {
    ++skipped_;
    ++consecutive_;
    last_reason_ = reason;
    return reason;
  }
  consecutive_ = 0;
  return reason;
}

nlohmann::json StepGuard::to_json() const {
  return {{"losses", losses_},
          {"grad_norms", grad_norms_},
          {"skipped", skipped_},
          {"consecutive", consecutive_},
          {"last_reason", last_reason_}};
}

void StepGuard::from_json(const nlohmann::json& state) {
  losses_ = state.at("losses").get<std::deque<double>>();
  grad_norms_ = state.at("grad_norms").get<std::deque<double>>();
  // A run resumed with a smaller skip_window judges its next step by the last `window` values
  // already (OLMo-core trims its list as it appends, before it judges).
  while (static_cast<int64_t>(losses_.size()) > config_.window) losses_.pop_front();
  while (static_cast<int64_t>(grad_norms_.size()) > config_.window) grad_norms_.pop_front();
  skipped_ = state.at("skipped").get<int64_t>();
  // Checkpoints of older moecore have neither: their runs count from the resume.
  consecutive_ = state.value("consecutive", int64_t{0});
  last_reason_ = state.value("last_reason", std::string());
}

}  // namespace moecore
