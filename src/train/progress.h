// The training progress display: on a terminal one line rewritten in place (step, loss, tokens/s,
// ETA); otherwise, as in a log file or CI, plain lines every log_every steps.
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

class Progress {
 public:
  // A disabled display prints nothing (ranks other than 0).
  Progress(int64_t max_steps, int64_t log_every, bool enabled = true);

  // Called after every step; prints when due (every step on a terminal, else every log_every).
  void update(int64_t step, double loss, double tokens_per_s, double seconds_per_step,
              const std::string& extra);
  // Prints a line that must not be overwritten (evaluation, warnings, checkpoints).
  void message(const std::string& line);
  // The step the run ends at, when a change of the batch size moved it.
  void set_max_steps(int64_t max_steps) { max_steps_ = max_steps; }

 private:
  int64_t max_steps_, log_every_;
  bool enabled_;
  bool terminal_;
  bool line_open_ = false;
};

}  // namespace moecore
