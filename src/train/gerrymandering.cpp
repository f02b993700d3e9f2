#include "train/gerrymandering.h"

#include <cmath>

namespace moecore {

namespace {

// Least-squares slope of values against 0..n-1, times (n - 1), divided by the mean.
double relative_trend(const std::deque<double>& values) {
  const double n = static_cast<double>(values.size());
  const double x_mean = (n - 1.0) / 2.0;
  double y_mean = 0.0;
  for (double v : values) y_mean += v;
  y_mean /= n;
  double cov = 0.0, var = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double dx = static_cast<double>(i) - x_mean;
    cov += dx * (values[i] - y_mean);
    var += dx * dx;
  }
  if (var == 0.0 || y_mean == 0.0) return 0.0;
  return cov / var * (n - 1.0) / y_mean;
}

}  // namespace

GerrymanderingDetector::Verdict GerrymanderingDetector::observe(double lb_loss,
                                                                double load_imbalance) {
  Verdict verdict;
  if (config_.window <= 1) return verdict;
  // A diverged step's values (NaN, Inf) say nothing about the router's trend and would make the
  // window, and the checkpoint that keeps it, unreadable: the step is left out and the window's
  // verdict stands.
  const bool observed = std::isfinite(lb_loss) && std::isfinite(load_imbalance);
  if (observed) {
    lb_.push_back(lb_loss);
    imbalance_.push_back(load_imbalance);
  }
  while (static_cast<int64_t>(lb_.size()) > config_.window) {
    lb_.pop_front();
    imbalance_.pop_front();
  }
  if (static_cast<int64_t>(lb_.size()) < config_.window) return verdict;
  verdict.lb_trend = relative_trend(lb_);
  verdict.imbalance_trend = relative_trend(imbalance_);
  verdict.flagged =
      verdict.lb_trend <= -config_.threshold && verdict.imbalance_trend >= config_.threshold;
  verdict.newly_flagged = verdict.flagged && !flagged_;
  flagged_ = verdict.flagged;
  return verdict;
}

nlohmann::json GerrymanderingDetector::to_json() const {
  return {{"lb", lb_}, {"imbalance", imbalance_}, {"flagged", flagged_}};
}

void GerrymanderingDetector::from_json(const nlohmann::json& state) {
  lb_ = state.at("lb").get<std::deque<double>>();
  imbalance_ = state.at("imbalance").get<std::deque<double>>();
  flagged_ = state.at("flagged").get<bool>();
}

}  // namespace moecore
