#include "train/step_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace moecore {

namespace {

// Mean and population standard deviation of the window.
std::pair<double, double> moments(const std::deque<double>& values) {
  double mean = 0.0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  double var = 0.0;
  for (double v : values) var += (v - mean) * (v - mean);
  return {mean, std::sqrt(var / static_cast<double>(values.size()))};
}

// The window's mean and spread of `values`, the spread floored at 1% of the mean: a window of
// near-identical values would otherwise call every tiny rise a spike, and skipped steps never
// enter the window to widen it again.
std::pair<double, double> band(const std::deque<double>& values) {
  const auto [mean, spread] = moments(values);
  return {mean, std::max(spread, 0.01 * std::abs(mean))};
}

}  // namespace

StepLimits StepGuard::limits() const {
  constexpr double kNone = std::numeric_limits<double>::infinity();
  if (config_.sigma <= 0.0 || static_cast<int64_t>(losses_.size()) < config_.min_window)
    return {kNone, kNone};
  const auto [loss_mean, loss_std] = band(losses_);
  const auto [norm_mean, norm_std] = band(grad_norms_);
  return {loss_mean + config_.sigma * loss_std, norm_mean + config_.sigma * norm_std};
}

std::string StepGuard::check(double loss, double grad_norm) {
  std::string reason;
  const StepLimits limit = limits();
  if (!std::isfinite(loss)) {
    reason = fmt::format("loss is {}", loss);
  } else if (!std::isfinite(grad_norm)) {
    reason = fmt::format("gradient norm is {}", grad_norm);
  } else if (loss > limit.loss) {
    const auto [mean, spread] = band(losses_);
    reason = fmt::format("loss spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", loss, mean,
                         config_.sigma, spread);
  } else if (grad_norm > limit.grad_norm) {
    const auto [mean, spread] = band(grad_norms_);
    reason = fmt::format("gradient-norm spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", grad_norm,
                         mean, config_.sigma, spread);
  }
  if (!reason.empty()) {
    ++skipped_;
    ++consecutive_;
    last_reason_ = reason;
    return reason;
  }
  consecutive_ = 0;
  losses_.push_back(loss);
  grad_norms_.push_back(grad_norm);
  while (static_cast<int64_t>(losses_.size()) > config_.window) {
    losses_.pop_front();
    grad_norms_.pop_front();
  }
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
  skipped_ = state.at("skipped").get<int64_t>();
  // Checkpoints of older moecore have neither: their runs count from the resume.
  consecutive_ = state.value("consecutive", int64_t{0});
  last_reason_ = state.value("last_reason", std::string());
}

}  // namespace moecore
