#include "io/metrics_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "core/check.h"
#include "io/file_util.h"

namespace moecore::io {

namespace {

constexpr const char* kTag = "[metrics]";

bool file_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  const int err = errno;
  MOE_CHECK(err == ENOENT, "{} {}: cannot stat: {}", kTag, path, errno_text(err));
  return false;
}

// Cuts a torn last line (no trailing newline, left by a killed writer) off `path`.
void drop_torn_tail(const std::string& path) {
  size_t keep = 0;
  size_t size = 0;
  {
    const MappedFile file = MappedFile::open(path, kTag);
    size = file.size();
    const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
    if (text.empty() || text.back() == '\n') return;
    const size_t newline = text.rfind('\n');
    keep = newline == std::string_view::npos ? 0 : newline + 1;
  }
  MOE_CHECK(::truncate(path.c_str(), static_cast<off_t>(keep)) == 0,
            "{} {}: cannot drop the torn last line ({} of {} bytes kept): {}", kTag, path, keep,
            size, errno_text(errno));
}

// Creates `dir`, prepares `<dir>/metrics.jsonl` for appending, and returns its path.
std::string prepare_jsonl(const std::string& dir, std::optional<int64_t> resume_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MOE_CHECK(!ec, "{} {}: cannot create the metrics directory: {}", kTag, dir, ec.message());
  std::string path = dir + "/metrics.jsonl";
  if (resume_step) {
    MetricsSink::truncate_after(path, *resume_step);
  } else if (file_exists(path)) {
    drop_torn_tail(path);
  }
  return path;
}

int write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t written = ::write(fd, data, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (written == 0) return EIO;
    data += written;
    n -= static_cast<size_t>(written);
  }
  return 0;
}

}  // namespace

MetricsSink::MetricsSink(const std::string& dir, std::optional<int64_t> resume_step)
    : jsonl_path_(prepare_jsonl(dir, resume_step)), tensorboard_(dir + "/tb") {
  fd_ = ::open(jsonl_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  MOE_CHECK(fd_ >= 0, "{} {}: cannot open for appending: {}", kTag, jsonl_path_, errno_text(errno));
  if (resume_step) {
    tensorboard_.add_session_start(*resume_step + 1);
    tensorboard_.flush();
  }
}

MetricsSink::MetricsSink(MetricsSink&& other) noexcept
    : jsonl_path_(std::move(other.jsonl_path_)),
      fd_(std::exchange(other.fd_, -1)),
      tensorboard_(std::move(other.tensorboard_)) {}

MetricsSink& MetricsSink::operator=(MetricsSink&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    jsonl_path_ = std::move(other.jsonl_path_);
    fd_ = std::exchange(other.fd_, -1);
    tensorboard_ = std::move(other.tensorboard_);
  }
  return *this;
}

MetricsSink::~MetricsSink() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsSink::log(int64_t step, const Scalars& scalars) {
  MOE_CHECK(fd_ >= 0, "{} {}: log() at step {} after close()", kTag, jsonl_path_, step);
  nlohmann::ordered_json line;
  line["step"] = step;
  std::unordered_set<std::string_view> seen;
  for (const auto& [name, value] : scalars) {
    MOE_CHECK(!name.empty() && name != "step", "{} {}: invalid metric name '{}' at step {}", kTag,
              jsonl_path_, name, step);
    MOE_CHECK(seen.insert(name).second, "{} {}: metric '{}' given twice at step {}", kTag,
              jsonl_path_, name, step);
    if (std::isfinite(value)) {
      line[name] = value;
    } else {
      line[name] = nullptr;
    }
  }
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.push_back('\n');
  const int err = write_all(fd_, text.data(), text.size());
  MOE_CHECK(err == 0, "{} {}: write failed: {}", kTag, jsonl_path_, errno_text(err));

  for (const auto& [name, value] : scalars) tensorboard_.add_scalar(name, value, step);
  tensorboard_.flush();
}

void MetricsSink::flush() {
  tensorboard_.flush();
}

void MetricsSink::close() {
  if (fd_ >= 0) {
    const int fd = std::exchange(fd_, -1);
    int err = 0;
    if (::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    MOE_CHECK(err == 0, "{} {}: cannot close: {}", kTag, jsonl_path_, errno_text(err));
  }
  tensorboard_.close();
}

void MetricsSink::truncate_after(const std::string& jsonl_path, int64_t step) {
  if (!file_exists(jsonl_path)) return;
  std::string kept;
  {
    const MappedFile file = MappedFile::open(jsonl_path, kTag);
    const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
    size_t begin = 0;
    int64_t line_number = 0;
    while (begin < text.size()) {
      const size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) break;  // torn last line: dropped
      ++line_number;
      const std::string_view line = text.substr(begin, end - begin);
      begin = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
      const nlohmann::json object =
          nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      MOE_CHECK(
          object.is_object() && object.contains("step") && object.at("step").is_number_integer(),
          "{} {}:{}: not a JSON object with an integer \"step\"", kTag, jsonl_path, line_number);
      if (object.at("step").get<int64_t>() <= step) {
        kept.append(line);
        kept.push_back('\n');
      }
    }
  }
  const std::span<const std::byte> chunk = std::as_bytes(std::span(kept.data(), kept.size()));
  write_file_atomic(jsonl_path, std::span(&chunk, 1), kTag);
}

}  // namespace moecore::io
