// Training metrics, written twice: one JSON object per line to `<dir>/metrics.jsonl`, and every
// scalar mirrored to TensorBoard event files in `<dir>/tb/` under the same tag.
//
// metrics.jsonl: each log() call appends one line, `{"step": N, "<name>": value, ...}`, with the
// names in the order given and doubles printed so that they read back bit-exactly. NaN and +-Inf
// are written as JSON null (plain JSON that every reader accepts; a pandas column stays numeric,
// null reading back as NaN). TensorBoard receives the NaN/Inf itself.
//
// Durability: each line goes to the kernel in one write(2) on an O_APPEND descriptor, so a killed
// process loses at most the line being written (no fsync: a power loss may lose more). A torn last
// line (no newline) left by a killed run is dropped when the file is next opened.
//
// Resume: the trainer passes the step it resumes from (the checkpoint's step S; 0 for a fresh run
// that reuses an out_dir). metrics.jsonl is then rewritten atomically keeping only the lines with
// step <= S, and the TensorBoard file gets a SessionLog START at step S + 1 so that TensorBoard
// drops what the interrupted run logged after S. Without a resume step the file is appended as is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/tensorboard_writer.h"

namespace moecore::io {

class MetricsSink {
 public:
  using Scalars = std::vector<std::pair<std::string, double>>;

  // Creates `dir` if needed and opens `<dir>/metrics.jsonl` for appending (created if absent) and a
  // TensorBoardWriter on `<dir>/tb`. With `resume_step` = S: truncate_after(jsonl, S) first, and
  // add_session_start(S + 1) on the TensorBoard writer.
  explicit MetricsSink(const std::string& dir, std::optional<int64_t> resume_step = std::nullopt);

  MetricsSink(MetricsSink&& other) noexcept;
  MetricsSink& operator=(MetricsSink&& other) noexcept;
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;
  ~MetricsSink();

  // Appends {"step": step, name: value, ...} as one line, and add_scalar(name, value, step) for
  // each scalar, then flushes the TensorBoard file. Names must be non-empty, unique and not
  // "step". Example: sink.log(10, {{"train/loss", 3.2}, {"train/lr", 1e-3}}).
  void log(int64_t step, const Scalars& scalars);

  // Makes the TensorBoard records visible to readers (log() already does). metrics.jsonl needs no
  // flushing.
  void flush();

  // fsync and close both files; throws on failure. Further log() calls throw.
  void close();

  const std::string& jsonl_path() const { return jsonl_path_; }
  TensorBoardWriter& tensorboard() { return tensorboard_; }

  // Rewrites `jsonl_path` atomically (write_file_atomic) keeping only the lines whose "step" is
  // <= `step`, in order. A torn last line (no newline) is dropped; any other line that is not a
  // JSON object with an integer "step" is an error naming the file and line. A missing file is
  // left missing.
  static void truncate_after(const std::string& jsonl_path, int64_t step);

 private:
  std::string jsonl_path_;
  int fd_ = -1;
  TensorBoardWriter tensorboard_;
};

}  // namespace moecore::io
