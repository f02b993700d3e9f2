// The phase timer: nothing accumulates while disabled, scoped phases and switch_to add to the
// right phase, reset clears, and every phase has a distinct name.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>

#include "core/phase_timer.h"

namespace moecore {
namespace {

void busy(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

TEST(PhaseTimer, AccumulatesOnlyWhenEnabled) {
  phase_timer::set_enabled(false);
  phase_timer::reset();
  { const ScopedPhase p(Phase::kExpertsForward); }
  for (double s : phase_timer::totals()) EXPECT_EQ(s, 0.0);

  phase_timer::set_enabled(true);
  {
    ScopedPhase p(Phase::kDispatchForward);
    busy(0.01);
    p.switch_to(Phase::kExpertsForward);
    busy(0.02);
  }
  { const ScopedPhase p(Phase::kExpertsForward); }
  phase_timer::set_enabled(false);
  const phase_timer::Totals t = phase_timer::totals();
  EXPECT_GE(t[static_cast<size_t>(Phase::kDispatchForward)], 0.009);
  EXPECT_GE(t[static_cast<size_t>(Phase::kExpertsForward)], 0.019);
  EXPECT_LT(t[static_cast<size_t>(Phase::kDispatchForward)],
            t[static_cast<size_t>(Phase::kExpertsForward)] + 0.5);
  EXPECT_EQ(t[static_cast<size_t>(Phase::kOptimizer)], 0.0);
  phase_timer::reset();
  for (double s : phase_timer::totals()) EXPECT_EQ(s, 0.0);
}

TEST(PhaseTimer, DistinctNames) {
  std::set<std::string> names;
  for (size_t i = 0; i < kPhaseCount; ++i) names.emplace(phase_name(static_cast<Phase>(i)));
  EXPECT_EQ(names.size(), kPhaseCount);
  EXPECT_EQ(phase_name(Phase::kCommunication), "communication");
}

}  // namespace
}  // namespace moecore
