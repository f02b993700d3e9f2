#include "io/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/check.h"
#include "io/crc32c.h"
#include "io/file_util.h"

namespace moecore::io {

namespace {

// ---- Protobuf wire format: just what Event, Summary, Summary.Value and SessionLog need.

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

double unix_seconds_now() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

// Event fields 1 (wall_time) and 2 (step), which every event here starts with.
std::string event_header(int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(unix_seconds_now()), 8);
  if (step != 0) {  // proto3: the default value is not written
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // int64: two's complement, 10 bytes if < 0
  }
  return event;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string name(buf);
  // Keep the file name a single path component.
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

}  // namespace

// ---- Masked CRC-32C
// ---------------------------------------------------------------------------

uint32_t masked_crc32c(std::span<const std::byte> data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ---- TensorBoardWriter
// ----------------------------------------------------------------------------

void TensorBoardWriter::FileCloser::operator()(std::FILE* f) const {
  std::fclose(f);  // flushes; errors cannot be reported from a destructor
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  MOE_CHECK(!ec, "[tensorboard] {}: cannot create the log directory: {}", log_dir, ec.message());

  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const std::string stem = fmt::format("{}/events.out.tfevents.{}.{}.{}.", log_dir, seconds,
                                       hostname(), static_cast<long>(::getpid()));
  int fd = -1;
  for (int n = 0; fd < 0; ++n) {
    path_ = stem + std::to_string(n);
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    MOE_CHECK(fd >= 0 || (errno == EEXIST && n < 1000), "[tensorboard] {}: cannot create: {}",
              path_, errno_text(errno));
  }
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    fail("[tensorboard] {}: cannot open: {}", path_, errno_text(err));
  }
  file_.reset(f);

  std::string event = event_header(0);
  put_bytes(event, 3, "brain.Event:2");
  write_event(event);
  flush();
}

void TensorBoardWriter::check_open(const char* what) const {
  MOE_CHECK(file_ != nullptr, "[tensorboard] {}: {} after close()", path_, what);
}

void TensorBoardWriter::write_event(const std::string& event) {
  check_open("write");
  std::string record;
  record.reserve(event.size() + 16);
  put_fixed(record, event.size(), 8);
  put_fixed(record, masked_crc32c(std::as_bytes(std::span(record.data(), 8))), 4);
  record += event;
  put_fixed(record, masked_crc32c(std::as_bytes(std::span(event.data(), event.size()))), 4);
  const size_t written = std::fwrite(record.data(), 1, record.size(), file_.get());
  MOE_CHECK(written == record.size(), "[tensorboard] {}: write failed: {}", path_,
            errno_text(errno));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  MOE_CHECK(!tag.empty(), "[tensorboard] {}: empty scalar tag at step {}", path_, step);
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_fixed(summary_value, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_header(step);
  put_bytes(event, 5, summary);
  write_event(event);
}

void TensorBoardWriter::add_session_start(int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);  // SessionLog.START
  std::string event = event_header(step);
  put_bytes(event, 7, session_log);
  write_event(event);
}

void TensorBoardWriter::flush() {
  check_open("flush");
  MOE_CHECK(std::fflush(file_.get()) == 0, "[tensorboard] {}: write failed: {}", path_,
            errno_text(errno));
}

void TensorBoardWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = file_.release();
  int err = 0;
  if (std::fflush(f) != 0) err = errno;
  if (err == 0 && ::fsync(::fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  MOE_CHECK(err == 0, "[tensorboard] {}: cannot close: {}", path_, errno_text(err));
}

}  // namespace moecore::io
