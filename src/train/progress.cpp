#include "train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "dist/mpi/mpi_runtime.h"

namespace moecore {

Progress::Progress(int64_t max_steps, int64_t log_every, bool enabled)
    : max_steps_(max_steps),
      log_every_(log_every),
      enabled_(enabled),
      // mpirun hands its ranks a pseudo-terminal even when its own output goes to a file, so
      // multi-rank runs always print plain lines.
      terminal_(::isatty(STDOUT_FILENO) == 1 && !dist::mpi_active()) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, double seconds_per_step,
                      const std::string& extra) {
  const bool due = step % log_every_ == 0 || step == max_steps_;
  if (!enabled_ || (!terminal_ && !due)) return;
  const double eta = seconds_per_step * static_cast<double>(max_steps_ - step);
  const std::string line =
      fmt::format("step {:>6}/{}  loss {:.4f}  {:>7.0f} tok/s  ETA {:>4.0f}s  {}", step, max_steps_,
                  loss, tokens_per_s, eta, extra);
  if (terminal_) {
    // Rewrite in place; keep the line on screen (newline) at every log_every step.
    fmt::print("\r\033[K{}", line);
    line_open_ = !due;
    if (due) fmt::print("\n");
  } else {
    fmt::print("{}\n", line);
  }
  std::fflush(stdout);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (line_open_) fmt::print("\n");
  line_open_ = false;
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

}  // namespace moecore
