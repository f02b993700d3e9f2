// Graceful stop of a training run on a signal: SIGTERM (a scheduler's preemption notice, sent to
// every task by srun), SIGINT (Ctrl-C) and SIGUSR1 (which mpirun forwards to all its ranks; its
// own SIGTERM handling kills the ranks after a second, too soon for a checkpoint).
//
// No signal handler runs on the compute threads: a handler's frame is pushed below the
// interrupted code's stack pointer, and oneDNN's JIT GEMM kernels keep data there (measured: a
// SIGUSR1 handled during training corrupted the heap inside dnnl_sgemm in ~10% of runs). Instead
// the stop signals are blocked in every thread and one watcher thread takes them with sigwait().
// While a StopSignals exists (the training loop), the first one is recorded for the trainer,
// which saves a checkpoint at the end of the step and stops; at any other time, or on a second
// Ctrl-C, the signal gets its default action (the process ends) as if nothing had blocked it.
#pragma once

namespace moecore {

// Call first thing in main, before any other thread exists (MPI's, OpenMP's, oneDNN's): they all
// inherit the blocked signals. Idempotent.
void start_stop_signal_watcher();

class StopSignals {
 public:
  StopSignals();   // from now on a stop signal is recorded instead of ending the process
  ~StopSignals();  // back to the default action
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since construction, or 0.
  int received() const;
  // From now on a stop signal ends the process (its default action), as after destruction;
  // returns what received() returned at that instant (atomically: no signal falls between).
  int disarm();
};

// Ends the process by `signo`'s default action (a stop signal: the process is killed by it).
[[noreturn]] void end_process_by(int signo);

// "SIGTERM", "SIGINT", "SIGUSR1", or "a signal".
const char* stop_signal_name(int signo);

}  // namespace moecore
