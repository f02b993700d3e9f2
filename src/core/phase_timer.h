// An accumulating wall-clock timer per training phase, for the time breakdown of `make bench`
// (train.profile = true). Scoped timers sit around whole phases (one attention block, one MoE
// dispatch, the optimizer step), never inside loops; when profiling is off a ScopedPhase costs
// one load and one branch. The timers are process-wide and used from the training thread only
// (OpenMP regions run inside a phase, never around one), and phases do not nest.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string_view>

namespace moecore {

enum class Phase : std::size_t {
  kAttentionForward,
  kAttentionBackward,
  kRouterForward,
  kRouterBackward,
  kDispatchForward,  // routes to the experts' rows: permutation and (ep > 1) the exchange
  kDispatchBackward,
  kExpertsForward,  // the grouped expert GEMMs
  kExpertsBackward,
  kSharedExpertForward,
  kSharedExpertBackward,
  kCombineForward,  // outputs back to their tokens (exchange) and the weighted sum
  kCombineBackward,
  kLmHeadForward,  // final projection and cross-entropy
  kLmHeadBackward,
  kOptimizer,      // clipping and the AdamW update (ZeRO-1: with the weight all-gather)
  kCommunication,  // gradient reduction (all-reduce or reduce-scatter) and the global norm
  kCount,
};

constexpr std::size_t kPhaseCount = static_cast<std::size_t>(Phase::kCount);

// "attention_forward", ..., "communication".
std::string_view phase_name(Phase phase);

namespace phase_timer {

// Seconds accumulated per phase since the last reset().
using Totals = std::array<double, kPhaseCount>;

void set_enabled(bool enabled);
bool enabled();
void reset();
Totals totals();
void add(Phase phase, double seconds);

}  // namespace phase_timer

namespace detail {
extern bool phase_timer_enabled;
// Written by the training thread, read by any (a communication thread's host read notes it).
extern std::atomic<Phase> current_phase;
}  // namespace detail

// The phase the training thread is in (whether or not the timers run), Phase::kCount outside any:
// where a host read of device memory fell (core/device_memory.h's HostReadLog).
inline Phase current_phase() {
  return detail::current_phase.load(std::memory_order_relaxed);
}

class ScopedPhase {
 public:
  explicit ScopedPhase(Phase phase)
      : phase_(phase), outer_(current_phase()), active_(detail::phase_timer_enabled) {
    detail::current_phase.store(phase, std::memory_order_relaxed);
    if (active_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedPhase() { stop(); }
  // Ends the current phase and starts `next` (consecutive phases without nested scopes).
  void switch_to(Phase next) {
    stop();
    phase_ = next;
    detail::current_phase.store(next, std::memory_order_relaxed);
    active_ = detail::phase_timer_enabled;
    if (active_) start_ = std::chrono::steady_clock::now();
  }
  void stop() {
    detail::current_phase.store(outer_, std::memory_order_relaxed);
    if (!active_) return;
    active_ = false;
    phase_timer::add(
        phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Phase phase_;
  Phase outer_;  // the phase the scope began in (Phase::kCount: none), current again after it
  bool active_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace moecore
