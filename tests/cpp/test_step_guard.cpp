// The step guard: non-finite steps are always skipped, spikes only once the window is warm, a
// non-positive sigma disables spike detection, skipped steps stay out of the window, and the
// JSON state restores the same decisions; OLMo-core's rule (its SkipStepOptimizer) with its own
// warm-up, sample deviation and skipped steps in the window.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "train/step_guard.h"

namespace moecore {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Healthy values with a little spread: loss ~ 2.0 +- 0.01, grad norm ~ 1.0 +- 0.01.
double healthy_loss(int i) {
  return 2.0 + 0.01 * std::sin(0.9 * i);
}
double healthy_norm(int i) {
  return 1.0 + 0.01 * std::cos(1.3 * i);
}

TEST(StepGuard, NonFiniteAlwaysSkipped) {
  StepGuard guard({6.0, 8, 4});
  // Before any window exists.
  EXPECT_NE(guard.check(kNan, 1.0).find("loss"), std::string::npos);
  EXPECT_NE(guard.check(2.0, kInf).find("gradient norm"), std::string::npos);
  EXPECT_FALSE(guard.check(-kInf, 1.0).empty());
  EXPECT_FALSE(guard.check(2.0, kNan).empty());
  EXPECT_EQ(guard.skipped(), 4);
  // Nothing non-finite entered the window.
  EXPECT_TRUE(guard.to_json().at("losses").empty());
  EXPECT_TRUE(guard.to_json().at("grad_norms").empty());

  // With spike detection off as well.
  StepGuard off({0.0, 8, 4});
  EXPECT_FALSE(off.check(kNan, kNan).empty());
  EXPECT_FALSE(off.check(1.0, kInf).empty());
  EXPECT_EQ(off.skipped(), 2);
}

TEST(StepGuard, SpikesSkippedOnlyAfterMinWindow) {
  StepGuard guard({3.0, 16, 5});
  // Huge values during warm-up are accepted: fewer than min_window healthy steps known.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(guard.check(healthy_loss(i), healthy_norm(i)), "");
  EXPECT_EQ(guard.check(2.5, 1.0), "");  // the 5th healthy step; would be a spike later
  for (int i = 5; i < 20; ++i) EXPECT_EQ(guard.check(healthy_loss(i), healthy_norm(i)), "") << i;
  EXPECT_EQ(guard.skipped(), 0);

  const std::string loss_spike = guard.check(10.0, 1.0);
  EXPECT_NE(loss_spike.find("loss spike"), std::string::npos) << loss_spike;
  const std::string norm_spike = guard.check(2.0, 50.0);
  EXPECT_NE(norm_spike.find("gradient-norm spike"), std::string::npos) << norm_spike;
  EXPECT_EQ(guard.skipped(), 2);
  // A value inside the band is still healthy; lower-than-usual losses are never spikes.
  EXPECT_EQ(guard.check(2.0, 1.0), "");
  EXPECT_EQ(guard.check(0.1, 0.01), "");
}

TEST(StepGuard, MinWindowCountsOnlyHealthySteps) {
  StepGuard guard({3.0, 16, 3});
  EXPECT_EQ(guard.check(2.0, 1.0), "");
  EXPECT_FALSE(guard.check(kNan, 1.0).empty());
  EXPECT_EQ(guard.check(2.01, 1.01), "");
  // Three steps were seen but only two were healthy: still warming up.
  EXPECT_EQ(guard.check(100.0, 1.0), "");
  EXPECT_FALSE(guard.check(1000.0, 1.0).empty());
}

TEST(StepGuard, NonPositiveSigmaDisablesSpikes) {
  for (double sigma : {0.0, -1.0}) {
    StepGuard guard({sigma, 8, 2});
    for (int i = 0; i < 10; ++i) EXPECT_EQ(guard.check(healthy_loss(i), healthy_norm(i)), "");
    EXPECT_EQ(guard.check(1e6, 1e6), "") << sigma;
    EXPECT_EQ(guard.skipped(), 0);
  }
}

TEST(StepGuard, SkippedValuesDoNotEnterWindow) {
  StepGuard guard({3.0, 8, 4});
  for (int i = 0; i < 8; ++i) EXPECT_EQ(guard.check(healthy_loss(i), healthy_norm(i)), "");
  const nlohmann::json before = guard.to_json();
  // A run of identical spikes: if the first widened the band, later ones would pass.
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(guard.check(5.0, 1.0).empty()) << i;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(guard.check(2.0, 4.0).empty()) << i;
  EXPECT_EQ(guard.skipped(), 10);
  EXPECT_EQ(guard.to_json().at("losses"), before.at("losses"));
  EXPECT_EQ(guard.to_json().at("grad_norms"), before.at("grad_norms"));
}

TEST(StepGuard, WindowIsBounded) {
  StepGuard guard({10.0, 4, 2});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(guard.check(1.0 + 0.1 * i, 1.0 + 0.01 * i), "");
  const nlohmann::json state = guard.to_json();
  ASSERT_EQ(state.at("losses").size(), 4u);
  EXPECT_DOUBLE_EQ(state.at("losses").front().get<double>(), 1.6);  // the last four steps
  EXPECT_DOUBLE_EQ(state.at("losses").back().get<double>(), 1.9);
  EXPECT_EQ(state.at("grad_norms").size(), 4u);
}

TEST(StepGuard, JsonRoundTripReproducesDecisions) {
  const StepGuardConfig config{3.0, 16, 5};
  StepGuard original(config);
  for (int i = 0; i < 12; ++i) original.check(healthy_loss(i), healthy_norm(i));
  original.check(9.0, 1.0);
  original.check(kNan, 1.0);
  ASSERT_EQ(original.skipped(), 2);

  StepGuard restored(config);
  restored.from_json(nlohmann::json::parse(original.to_json().dump()));
  EXPECT_EQ(restored.to_json(), original.to_json());
  EXPECT_EQ(restored.skipped(), 2);

  // The same inputs get the same decisions and messages from here on.
  const std::vector<std::pair<double, double>> inputs = {
      {2.0, 1.0}, {3.0, 1.0}, {2.005, 1.005}, {2.0, 3.0}, {kInf, 1.0}, {1.99, 0.99}, {2.2, 1.0}};
  for (const auto& [loss, norm] : inputs)
    EXPECT_EQ(restored.check(loss, norm), original.check(loss, norm));
  EXPECT_EQ(restored.to_json(), original.to_json());
  EXPECT_EQ(restored.skipped(), original.skipped());

  // A fresh guard without the state does not make the same decision.
  StepGuard fresh(config);
  EXPECT_EQ(fresh.check(9.0, 1.0), "");
}

// OLMo-core's get_step_factor: judged once its list, the step's own value included, holds
// max(2, window / 2) values; mean and sample deviation of the earlier ones (at most `window`);
// skipped (finite) steps enter the list; no floor.
TEST(StepGuard, OlmoCoreRuleFollowsItsSkipStepOptimizer) {
  StepGuard guard({2.0, 8, 0, SkipRule::kOlmoCore});
  // Steps 1-3 are not judged (3 values with the step's own < 8 / 2): a huge loss is applied.
  EXPECT_EQ(guard.check(2.0, 1.0), "");
  EXPECT_EQ(guard.check(2.2, 1.0), "");
  EXPECT_EQ(guard.check(9.0, 1.0), "");
  // Step 4 is judged against 2.0, 2.2, 9.0: mean 4.4, sample deviation sqrt(15.88) = 3.985, so
  // the limit is 4.4 + 2 x 3.985 = 12.37 (the population deviation would give 10.91).
  const StepLimits limits = guard.limits();
  EXPECT_NEAR(limits.loss, 4.4 + 2.0 * std::sqrt(15.88), 1e-12);
  EXPECT_EQ(guard.check(12.0, 1.0), "");  // above the population band, inside the sample one
  // A spike is skipped and enters the window: the next band is wider.
  const std::string spike = guard.check(100.0, 1.0);
  EXPECT_NE(spike.find("loss spike"), std::string::npos) << spike;
  EXPECT_EQ(guard.skipped(), 1);
  EXPECT_EQ(guard.to_json().at("losses").size(), 5u);
  EXPECT_GT(guard.limits().loss, 100.0);
  // Constant values: zero deviation and no floor, so any rise is a spike; an equal value is not.
  StepGuard flat({6.0, 8, 0, SkipRule::kOlmoCore});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(flat.check(2.0, 1.0), "");
  EXPECT_EQ(flat.check(2.0, 1.0), "");
  EXPECT_FALSE(flat.check(2.0 + 1e-9, 1.0).empty());
  // Non-finite steps are skipped and stay out of the window.
  EXPECT_FALSE(flat.check(kNan, 1.0).empty());
  EXPECT_EQ(flat.to_json().at("losses").size(), 5u);
  // The window keeps the last `window` values.
  for (int i = 0; i < 20; ++i) flat.check(healthy_loss(i), healthy_norm(i));
  EXPECT_EQ(flat.to_json().at("losses").size(), 8u);
}

}  // namespace
}  // namespace moecore
