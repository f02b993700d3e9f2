#include "train/stop_signals.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace moecore {

namespace {

std::atomic<bool> g_armed{false};
std::atomic<int> g_received{0};

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
    if (g_armed.load()) {
      int none = 0;
      if (g_received.compare_exchange_strong(none, signo)) continue;  // the first: recorded
      if (signo != SIGINT) continue;  // repeated notices while the checkpoint is written
    }
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
  g_received.store(0);
  g_armed.store(true);
}

StopSignals::~StopSignals() {
  g_armed.store(false);
}

int StopSignals::received() const {
  return g_received.load();
}

int StopSignals::disarm() {
  g_armed.store(false);
  return g_received.load();
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
