// The phase timer: nothing accumulates while disabled, scoped phases and switch_to add to the
// right phase, reset clears, and every phase has a distinct name; with a device's clock
// registered, the phases take the device's times (a clock that charges a fixed time per mark
// here; kernels/cuda/phase_clock.h on a GPU) and a phase the clock cannot mark is not timed.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

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

namespace phase_timer_tests {

// A device clock whose every mark takes `seconds`, and which can be told it cannot mark (a
// capture); it records what it was asked.
class FixedMarkClock final : public DevicePhaseClock {
 public:
  explicit FixedMarkClock(double seconds) : seconds_(seconds) {}
  const char* name() const override { return "fixed mark clock"; }
  bool can_mark() const override { return markable; }
  int64_t begin(Phase phase) override {
    begun.push_back(phase);
    open_.push_back({phase, false});
    return static_cast<int64_t>(open_.size() - 1);
  }
  void end(int64_t id) noexcept override { open_[static_cast<size_t>(id)].ended = true; }
  void collect() override {
    for (const auto& [phase, ended] : open_)
      if (ended) phase_timer::add(phase, seconds_);
    open_.clear();
    ++collects;
  }
  bool markable = true;
  std::vector<Phase> begun;
  int collects = 0;

 private:
  struct Mark {
    Phase phase;
    bool ended;
  };
  double seconds_;
  std::vector<Mark> open_;
};

double total(Phase phase) {
  return phase_timer::totals()[static_cast<size_t>(phase)];
}

TEST(PhaseTimer, ADeviceClockTimesThePhasesInsteadOfTheHost) {
  FixedMarkClock clock(0.25);
  phase_timer::set_enabled(true);
  phase_timer::reset();
  phase_timer::set_device_clock(&clock);
  EXPECT_STREQ(phase_timer::clock_name(), "fixed mark clock");
  {
    ScopedPhase p(Phase::kDispatchForward);
    busy(0.01);  // host time: not counted
    p.switch_to(Phase::kExpertsForward);
  }
  { const ScopedPhase p(Phase::kExpertsForward); }
  EXPECT_EQ(clock.begun, (std::vector<Phase>{Phase::kDispatchForward, Phase::kExpertsForward,
                                             Phase::kExpertsForward}));
  // totals() collects what the device finished first: exactly the clock's times.
  EXPECT_EQ(total(Phase::kDispatchForward), 0.25);
  EXPECT_EQ(total(Phase::kExpertsForward), 0.5);
  EXPECT_EQ(total(Phase::kOptimizer), 0.0);

  // A phase the clock cannot mark (its work captured into a graph) is not timed at all.
  clock.markable = false;
  { const ScopedPhase p(Phase::kOptimizer); }
  clock.markable = true;
  EXPECT_EQ(clock.begun.size(), 3u);
  EXPECT_EQ(total(Phase::kOptimizer), 0.0);

  // reset() collects before it clears: a phase marked before it is not added after it.
  { const ScopedPhase p(Phase::kOptimizer); }
  phase_timer::reset();
  EXPECT_EQ(total(Phase::kOptimizer), 0.0);

  // Without the clock the host's wall clock times the phases again; the clock's last marks are
  // collected as it goes.
  { const ScopedPhase p(Phase::kRouterForward); }
  const int collects = clock.collects;
  phase_timer::set_device_clock(nullptr);
  EXPECT_EQ(clock.collects, collects + 1);
  EXPECT_EQ(total(Phase::kRouterForward), 0.25);
  EXPECT_STREQ(phase_timer::clock_name(), "host wall clock");
  {
    const ScopedPhase p(Phase::kLmHeadForward);
    busy(0.01);
  }
  EXPECT_GE(total(Phase::kLmHeadForward), 0.009);
  EXPECT_EQ(clock.begun.size(), 5u);
  phase_timer::set_enabled(false);
  phase_timer::reset();
}

}  // namespace phase_timer_tests

TEST(PhaseTimer, DistinctNames) {
  std::set<std::string> names;
  for (size_t i = 0; i < kPhaseCount; ++i) names.emplace(phase_name(static_cast<Phase>(i)));
  EXPECT_EQ(names.size(), kPhaseCount);
  EXPECT_EQ(phase_name(Phase::kCommunication), "communication");
}

}  // namespace
}  // namespace moecore
