#include "train/step_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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

}  // namespace

std::string StepGuard::check(double loss, double grad_norm) {
  std::string reason;
  if (!std::isfinite(loss)) {
    reason = fmt::format("loss is {}", loss);
  } else if (!std::isfinite(grad_norm)) {
    reason = fmt::format("gradient norm is {}", grad_norm);
  } else if (config_.sigma > 0.0 && static_cast<int64_t>(losses_.size()) >= config_.min_window) {
    // The spread is floored at 1% of the mean: a window of near-identical values would otherwise
    // call every tiny rise a spike, and skipped steps never enter the window to widen it again.
    auto [loss_mean, loss_std] = moments(losses_);
    auto [norm_mean, norm_std] = moments(grad_norms_);
    loss_std = std::max(loss_std, 0.01 * std::abs(loss_mean));
    norm_std = std::max(norm_std, 0.01 * std::abs(norm_mean));
    if (loss > loss_mean + config_.sigma * loss_std)
      reason = fmt::format("loss spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", loss, loss_mean,
                           config_.sigma, loss_std);
    else if (grad_norm > norm_mean + config_.sigma * norm_std)
      reason = fmt::format("gradient-norm spike: {:.4f} > mean {:.4f} + {} x std {:.4f}", grad_norm,
                           norm_mean, config_.sigma, norm_std);
  }
  if (!reason.empty()) {
    ++skipped_;
    return reason;
  }
  losses_.push_back(loss);
  grad_norms_.push_back(grad_norm);
  while (static_cast<int64_t>(losses_.size()) > config_.window) {
    losses_.pop_front();
    grad_norms_.pop_front();
  }
  return reason;
}

nlohmann::json StepGuard::to_json() const {
  return {{"losses", losses_}, {"grad_norms", grad_norms_}, {"skipped", skipped_}};
}

void StepGuard::from_json(const nlohmann::json& state) {
  losses_ = state.at("losses").get<std::deque<double>>();
  grad_norms_ = state.at("grad_norms").get<std::deque<double>>();
  skipped_ = state.at("skipped").get<int64_t>();
}

}  // namespace moecore
