// The gerrymandering detector on controlled series: it must flag a falling load-balancing loss with
// rising imbalance, and stay quiet for healthy training (both falling), noise, and a short history.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/gerrymandering.h"

namespace moecore {
namespace {

TEST(Gerrymandering, FlagsFallingLossWithRisingImbalance) {
  GerrymanderingDetector detector({50, 0.05});
  int newly = 0;
  bool flagged = false;
  for (int t = 0; t < 120; ++t) {
    // lb falls 1.30 -> 1.10 while imbalance climbs 1.5 -> 2.1 over the run.
    const auto v = detector.observe(1.30 - 0.2 * t / 120.0, 1.5 + 0.6 * t / 120.0);
    newly += v.newly_flagged;
    flagged = v.flagged;
    if (t >= 49) {
      EXPECT_LT(v.lb_trend, 0.0);
      EXPECT_GT(v.imbalance_trend, 0.0);
    }
  }
  EXPECT_TRUE(flagged);
  EXPECT_EQ(newly, 1);  // one warning per episode
}

TEST(Gerrymandering, QuietWhenBothImprove) {
  GerrymanderingDetector detector({50, 0.05});
  for (int t = 0; t < 200; ++t) {
    const auto v = detector.observe(1.30 - 0.2 * t / 200.0, 2.0 - 0.8 * t / 200.0);
    EXPECT_FALSE(v.flagged) << "step " << t;
  }
}

TEST(Gerrymandering, QuietOnNoiseAndShortHistory) {
  GerrymanderingDetector detector({50, 0.05});
  for (int t = 0; t < 49; ++t) EXPECT_FALSE(detector.observe(2.0 - t, 1.0 + t).flagged);
  GerrymanderingDetector noisy({50, 0.05});
  for (int t = 0; t < 300; ++t) {
    const double wiggle = 0.01 * std::sin(0.7 * t);
    EXPECT_FALSE(noisy.observe(1.05 + wiggle, 1.3 - wiggle).flagged) << "step " << t;
  }
}

TEST(Gerrymandering, ReArmsAfterClearingAndRestoresState) {
  GerrymanderingDetector detector({20, 0.05});
  int newly = 0;
  for (int t = 0; t < 40; ++t)
    newly += detector.observe(2.0 - 0.02 * t, 1.0 + 0.05 * t).newly_flagged;
  for (int t = 0; t < 40; ++t) newly += detector.observe(1.2, 3.0 - 0.05 * t).newly_flagged;
  for (int t = 0; t < 40; ++t)
    newly += detector.observe(1.2 - 0.02 * t, 1.0 + 0.05 * t).newly_flagged;
  EXPECT_EQ(newly, 2);

  GerrymanderingDetector copy({20, 0.05});
  copy.from_json(detector.to_json());
  EXPECT_EQ(copy.to_json(), detector.to_json());
  const auto a = detector.observe(0.5, 4.0), b = copy.observe(0.5, 4.0);
  EXPECT_EQ(a.flagged, b.flagged);
  EXPECT_DOUBLE_EQ(a.lb_trend, b.lb_trend);
}

TEST(Gerrymandering, NonFiniteStepsStayOutOfTheWindowAndItsState) {
  // A diverged step (NaN or Inf loss) must not enter the window: it would poison the trends for
  // a window's length and make the checkpoint's state (JSON null) unreadable on resume.
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  GerrymanderingDetector detector({20, 0.05}), healthy({20, 0.05});
  for (int t = 0; t < 30; ++t) {
    const double lb = 2.0 - 0.02 * t, imbalance = 1.0 + 0.05 * t;
    healthy.observe(lb, imbalance);
    detector.observe(lb, imbalance);
    const auto v = detector.observe(t % 2 ? kNan : kInf, t % 3 ? 1.0 : kNan);
    EXPECT_TRUE(std::isfinite(v.lb_trend) && std::isfinite(v.imbalance_trend)) << "step " << t;
    EXPECT_FALSE(v.newly_flagged);  // the verdict of the window as it was
  }
  EXPECT_EQ(detector.to_json(), healthy.to_json());
  GerrymanderingDetector resumed({20, 0.05});
  resumed.from_json(nlohmann::json::parse(detector.to_json().dump()));
  EXPECT_EQ(resumed.to_json(), healthy.to_json());
}

}  // namespace
}  // namespace moecore
