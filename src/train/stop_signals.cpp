#include "train/stop_signals.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <thread>

namespace moecore {

namespace {

// One atomic, so that disarming and recording cannot interleave (a signal recorded just after the
// trainer stopped looking would be lost): kDisarmed, the default action; 0, armed with nothing
// received; > 0, armed, the first stop signal received.
constexpr int kDisarmed = -1;
std::atomic<int> g_state{kDisarmed};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signo : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&set, signo);
  return set;
}

}  // namespace

// The signal's default action, from this thread: unblocked here, raised at this thread.
[[noreturn]] void end_process_by(int signo) {
  std::signal(signo, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signo);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  pthread_kill(pthread_self(), signo);
  for (;;) std::this_thread::yield();  // not reached: the default action ends the process
}

namespace {

void watch_stop_signals() {
  const sigset_t set = stop_signal_set();
  for (;;) {
    int signo = 0;
    if (sigwait(&set, &signo) != 0) continue;
    int state = 0;
    if (g_state.compare_exchange_strong(state, signo)) continue;  // armed, the first: recorded
    // Armed with one recorded: repeated notices while the checkpoint is written are ignored.
    if (state != kDisarmed && signo != SIGINT) continue;
    end_process_by(signo);  // not training, or Ctrl-C pressed again
  }
}

}  // namespace

void start_stop_signal_watcher() {
  static const bool started = [] {
    const sigset_t set = stop_signal_set();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread(watch_stop_signals).detach();
    return true;
  }();
  (void)started;
}

StopSignals::StopSignals() {
  g_state.store(0);
}

StopSignals::~StopSignals() {
  g_state.store(kDisarmed);
}

int StopSignals::received() const {
  return std::max(g_state.load(), 0);
}

int StopSignals::disarm() {
  return std::max(g_state.exchange(kDisarmed), 0);
}

const char* stop_signal_name(int signo) {
  switch (signo) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace moecore
