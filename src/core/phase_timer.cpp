#include "core/phase_timer.h"

namespace moecore {

namespace detail {
bool phase_timer_enabled = false;
DevicePhaseClock* device_phase_clock = nullptr;
std::atomic<Phase> current_phase{Phase::kCount};
}  // namespace detail

namespace {
phase_timer::Totals g_totals{};
}

std::string_view phase_name(Phase phase) {
  static constexpr std::array<std::string_view, kPhaseCount> kNames = {
      "attention_forward",     "attention_backward",     "router_forward",  "router_backward",
      "dispatch_forward",      "dispatch_backward",      "experts_forward", "experts_backward",
      "shared_expert_forward", "shared_expert_backward", "combine_forward", "combine_backward",
      "lm_head_forward",       "lm_head_backward",       "optimizer",       "communication"};
  return kNames[static_cast<std::size_t>(phase)];
}

namespace phase_timer {

void set_enabled(bool on) {
  detail::phase_timer_enabled = on;
}
bool enabled() {
  return detail::phase_timer_enabled;
}
void reset() {
  collect_device();  // so that no phase marked before the reset is added after it
  g_totals.fill(0.0);
}
Totals totals() {
  collect_device();
  return g_totals;
}
void add(Phase phase, double seconds) {
  g_totals[static_cast<std::size_t>(phase)] += seconds;
}

void set_device_clock(DevicePhaseClock* clock) {
  collect_device();  // what the previous clock marked is the totals' before it goes
  detail::device_phase_clock = clock;
}
DevicePhaseClock* device_clock() {
  return detail::device_phase_clock;
}
const char* clock_name() {
  return detail::device_phase_clock != nullptr ? detail::device_phase_clock->name()
                                               : "host wall clock";
}
void collect_device() {
  if (detail::device_phase_clock != nullptr) detail::device_phase_clock->collect();
}

}  // namespace phase_timer

}  // namespace moecore
