// TensorBoard event files, written without TensorFlow or protobuf.
//
// An event file is a sequence of TFRecords, each framing one serialized tensorflow.Event:
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data[length]
//   | uint32 masked_crc32c(data)
// where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (mod 2^32).
//
// The few protobuf fields written here are encoded by hand (field number, wire type):
//   tensorflow.Event         wall_time    = 1 (double,  fixed64)
//                            step         = 2 (int64,   varint)
//                            file_version = 3 (string,  length-delimited) "brain.Event:2"
//                            summary      = 5 (Summary, length-delimited)
//                            session_log  = 7 (SessionLog, length-delimited)
//   tensorflow.Summary       value        = 1 (repeated Summary.Value, length-delimited)
//   tensorflow.Summary.Value tag          = 1 (string,  length-delimited)
//                            simple_value = 2 (float,   fixed32)
//   tensorflow.SessionLog    status       = 1 (enum,    varint; START = 1)
// (tensorboard/compat/proto/event.proto and summary.proto; checked against tensorboard 2.20.0.)
//
// Scalars are stored as simple_value, a 32-bit float, as PyTorch's SummaryWriter does: TensorBoard,
// EventAccumulator and tbparse read them as scalars. NaN and +-Inf are written as they are.
//
// Resumed runs: with file_version "brain.Event:2", TensorBoard discards events with step >= S from
// earlier files only when it reads a SessionLog START event at step S. A writer that resumes after
// a checkpoint at step C therefore calls add_session_start(C + 1) before its first scalar, so that
// the steps logged after C by the interrupted run disappear from the plots.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "io/crc32c.h"  // crc32c, which the records' masked CRC is made of

namespace moecore::io {

// The TFRecord masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 of crc32c(data).
uint32_t masked_crc32c(std::span<const std::byte> data);

// Appends TFRecord-framed tensorflow.Event records to a new event file. Move-only. Every I/O
// failure throws moecore::Error naming the file and strerror.
class TensorBoardWriter {
 public:
  // Creates `log_dir` (and parents) and the file
  // `<log_dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>`, n = 0 unless that name is
  // taken (then 1, 2, ...; a file is never overwritten), and writes the first Event, carrying
  // file_version "brain.Event:2". The first event is flushed, so the file is visible at once.
  explicit TensorBoardWriter(const std::string& log_dir);

  TensorBoardWriter(TensorBoardWriter&&) noexcept = default;
  TensorBoardWriter& operator=(TensorBoardWriter&&) noexcept = default;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  // Flushes and closes; errors are swallowed here (call close() to see them).
  ~TensorBoardWriter() = default;

  // Event{wall_time = now, step, summary{value{tag, simple_value = float(value)}}}. Buffered:
  // readers see it after flush().
  void add_scalar(const std::string& tag, double value, int64_t step);

  // Event{wall_time = now, step, session_log{status = START}}: TensorBoard drops the events with
  // step >= `step` that it read before this one (see the file comment on resumed runs).
  void add_session_start(int64_t step);

  // Hands buffered records to the kernel (fflush), so that readers see them. No fsync.
  void flush();

  // fflush, fsync and fclose; throws on failure. Afterwards the writer is closed: any further
  // add_scalar or flush throws. Calling close() twice is a no-op.
  void close();

  bool is_open() const { return file_ != nullptr; }
  // The event file's full path.
  const std::string& path() const { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const;
  };

  void write_event(const std::string& event);
  void check_open(const char* what) const;

  std::unique_ptr<std::FILE, FileCloser> file_;
  std::string path_;
};

}  // namespace moecore::io
