#include "train/spike_monitor.h"

#include <cmath>

namespace moecore {

namespace {

template <typename T>
void push_bounded(std::deque<T>& history, T value, int64_t size) {
  history.push_back(value);
  while (static_cast<int64_t>(history.size()) > size) history.pop_front();
}

}  // namespace

bool SpikeMonitor::is_spike(double value, const std::deque<double>& history) const {
  if (static_cast<int64_t>(history.size()) < config_.window) return false;
  const double n = static_cast<double>(history.size());
  double sum = 0.0;
  for (const double x : history) sum += x;
  const double mean = sum / n;
  double squares = 0.0;
  for (const double x : history) squares += (x - mean) * (x - mean);
  const double std = std::sqrt(squares / n);
  if (std < 1e-10) return false;
  return value > mean + config_.threshold_std * std;
}

SpikeMonitor::Scores SpikeMonitor::observe(double ce_loss, double grad_norm) {
  Scores scores;
  if (!config_.enabled || !std::isfinite(ce_loss) || !std::isfinite(grad_norm)) return scores;
  const bool loss_spike = is_spike(ce_loss, losses_);
  push_bounded(losses_, ce_loss, config_.window);
  const bool norm_spike = is_spike(grad_norm, grad_norms_);
  push_bounded(grad_norms_, grad_norm, config_.window);
  scores.spike = loss_spike || norm_spike;
  push_bounded(spikes_, scores.spike, config_.rolling_window);
  ++total_steps_;
  total_spikes_ += scores.spike;
  if (static_cast<int64_t>(spikes_.size()) >= config_.rolling_window) {
    int64_t recent = 0;
    for (const bool s : spikes_) recent += s;
    scores.running = static_cast<double>(recent) / static_cast<double>(config_.rolling_window);
  }
  if (total_steps_ >= config_.window)
    scores.total = static_cast<double>(total_spikes_) / static_cast<double>(total_steps_);
  return scores;
}

nlohmann::json SpikeMonitor::to_json() const {
  return {{"losses", losses_},
          {"grad_norms", grad_norms_},
          {"spikes", spikes_},
          {"total_spikes", total_spikes_},
          {"total_steps", total_steps_}};
}

void SpikeMonitor::from_json(const nlohmann::json& state) {
  losses_ = state.at("losses").get<std::deque<double>>();
  grad_norms_ = state.at("grad_norms").get<std::deque<double>>();
  spikes_ = state.at("spikes").get<std::deque<bool>>();
  total_spikes_ = state.at("total_spikes").get<int64_t>();
  total_steps_ = state.at("total_steps").get<int64_t>();
  while (static_cast<int64_t>(losses_.size()) > config_.window) losses_.pop_front();
  while (static_cast<int64_t>(grad_norms_.size()) > config_.window) grad_norms_.pop_front();
  while (static_cast<int64_t>(spikes_.size()) > config_.rolling_window) spikes_.pop_front();
}

}  // namespace moecore
