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
#include <cstdint>
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
// reset() and totals() first collect the device clock's finished phases (waiting for the device).
void reset();
Totals totals();
void add(Phase phase, double seconds);

}  // namespace phase_timer

// The phases' clock where their work runs on a device (train.profile on a GPU). There the host
// only issues a phase's work, so the wall-clock time of its scope says how long issuing took, not
// how long the device ran it. A backend whose operations run on a device registers a clock
// (phase_timer::set_device_clock, as it registers its memory) that marks a scope's start and end
// in the device's work (CUDA: events on the backend's stream) and adds the time between the two
// to the phase once the device has got there.
class DevicePhaseClock {
 public:
  virtual ~DevicePhaseClock() = default;
  // What the profile says its phases were timed by.
  virtual const char* name() const = 0;
  // Whether a phase can be marked now: not while the device's work is captured into a graph
  // (train.cuda_graph), whose replays run no host code; such a phase is not timed at all.
  virtual bool can_mark() const = 0;
  // Marks a phase's start in the device's work; end() its end. The id is begin()'s return.
  // end() runs in ScopedPhase's destructor, also while an error unwinds the phase: it must not
  // throw (a mark it cannot record is left untimed).
  virtual int64_t begin(Phase phase) = 0;
  virtual void end(int64_t id) noexcept = 0;
  // Waits until the device has passed every ended mark, adds each such phase's seconds
  // (phase_timer::add) and forgets those marks.
  virtual void collect() = 0;
};

namespace phase_timer {
// The clock of the phases from now on: a device's, or null for the host's wall clock.
void set_device_clock(DevicePhaseClock* clock);
DevicePhaseClock* device_clock();
// "host wall clock" or the device clock's name.
const char* clock_name();
// The device clock's finished phases into the totals (nothing without one).
void collect_device();
}  // namespace phase_timer

namespace detail {
extern bool phase_timer_enabled;
extern DevicePhaseClock* device_phase_clock;
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
  explicit ScopedPhase(Phase phase) : phase_(phase), outer_(current_phase()) {
    start();  // first: a device clock's begin() may throw, and no destructor would then run
    detail::current_phase.store(phase, std::memory_order_relaxed);
  }
  ~ScopedPhase() { stop(); }
  // Ends the current phase and starts `next` (consecutive phases without nested scopes).
  void switch_to(Phase next) {
    stop();
    phase_ = next;
    detail::current_phase.store(next, std::memory_order_relaxed);
    start();
  }
  void stop() {
    detail::current_phase.store(outer_, std::memory_order_relaxed);
    if (!active_) return;
    active_ = false;
    if (clock_ != nullptr) {
      clock_->end(mark_);
    } else {
      phase_timer::add(
          phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  void start() {
    if (!detail::phase_timer_enabled) return;
    clock_ = detail::device_phase_clock;
    if (clock_ == nullptr) {
      start_ = std::chrono::steady_clock::now();
    } else if (clock_->can_mark()) {
      mark_ = clock_->begin(phase_);
    } else {
      return;  // not timed
    }
    active_ = true;  // only once marked: a throw above leaves no stale mark to end
  }

  Phase phase_;
  Phase outer_;  // the phase the scope began in (Phase::kCount: none), current again after it
  bool active_ = false;
  DevicePhaseClock* clock_ = nullptr;  // the device's clock the scope was marked on, or null
  int64_t mark_ = 0;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace moecore
