#include "io/file_checksums.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/escape.h"
#include "io/crc32c.h"
#include "io/file_util.h"

namespace moecore::io {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kAlgorithm = "crc32c";

struct FileCrc {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// The file's size and CRC-32C, read in blocks with pread.
FileCrc file_crc32c(const std::string& path, const char* tag) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "{} cannot open '{}': {}", tag, path, errno_text(errno));
  // A block on the stack: no heap buffer while a checkpoint is saved (tests/alloc holds a save
  // to no allocation above 64 KiB); page-cache reads of 32 KiB cost ~1 us of system call each.
  std::array<std::byte, 32 * 1024> block;
  Crc32c crc;
  uint64_t total = 0;
  for (;;) {
    const ssize_t got = ::pread(fd, block.data(), block.size(), static_cast<off_t>(total));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      fail("{} cannot read '{}' at byte {}: {}", tag, path, total, errno_text(err));
    }
    if (got == 0) break;
    crc.update({block.data(), static_cast<size_t>(got)});
    total += static_cast<uint64_t>(got);
  }
  ::close(fd);
  return {total, crc.value()};
}

std::string hex(uint32_t value) {
  return fmt::format("{:08x}", value);
}

nlohmann::json entry_of(const FileCrc& file) {
  return {{"bytes", file.bytes}, {"crc32c", hex(file.crc)}};
}

}  // namespace

nlohmann::json checksum_entries(const std::string& dir, const std::vector<std::string>& names,
                                const char* tag) {
  nlohmann::json entries = nlohmann::json::object();
  for (const std::string& name : names)
    entries[name] = entry_of(file_crc32c(dir + "/" + name, tag));
  return entries;
}

void write_checksums(const std::string& dir, const std::string& manifest, const char* tag,
                     const nlohmann::json& known) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    const std::string name = entry.path().filename().string();
    if (name != manifest && entry.is_regular_file(type_ec) && !entry.is_symlink(type_ec))
      names.push_back(name);
  }
  MOE_CHECK(!ec, "{} cannot list '{}': {}", tag, dir, ec.message());
  std::sort(names.begin(), names.end());
  nlohmann::json files = nlohmann::json::object();
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    const auto it = known.find(name);
    if (it != known.end() && it->contains("bytes") && (*it)["bytes"].is_number_unsigned() &&
        (*it)["bytes"].get<uint64_t>() == fs::file_size(path, ec) && !ec) {
      files[name] = *it;
    } else {
      files[name] = entry_of(file_crc32c(path, tag));
    }
  }
  const nlohmann::json doc = {{"algorithm", kAlgorithm}, {"files", files}};
  write_text_atomic(dir + "/" + manifest, doc.dump(1) + "\n", tag);
}

bool verify_checksums(const std::string& dir, const std::string& manifest, const char* tag,
                      int64_t share_index, int64_t share_count) {
  const std::string manifest_path = dir + "/" + manifest;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(manifest_path, ec))) return false;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(read_text(manifest_path, tag));
  } catch (const nlohmann::json::exception& e) {
    fail("{} {}: not valid JSON: {}", tag, manifest_path, escape_for_message(e.what()));
  }
  MOE_CHECK(
      doc.is_object() && doc.value("algorithm", nlohmann::json()) == kAlgorithm &&
          doc.contains("files") && doc["files"].is_object(),
      "{} {}: not a checksum manifest (expected {{\"algorithm\": \"{}\", \"files\": {{...}}}})",
      tag, manifest_path, kAlgorithm);
  int64_t position = -1;
  for (const auto& [name, entry] : doc["files"].items()) {
    ++position;
    const std::string path = dir + "/" + name;
    MOE_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
              "{} {}: '{}' is not a file name of this directory", tag, manifest_path,
              escape_for_message(name));
    MOE_CHECK(entry.is_object() && entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
                  entry.contains("crc32c") && entry["crc32c"].is_string(),
              "{} {}: the entry of '{}' is not {{\"bytes\": N, \"crc32c\": \"hex\"}}", tag,
              manifest_path, escape_for_message(name));
    MOE_CHECK(fs::is_regular_file(path, ec), "{} {}: missing (listed in {})", tag, path, manifest);
    const uint64_t bytes = entry["bytes"].get<uint64_t>();
    const uint64_t size = fs::file_size(path, ec);
    MOE_CHECK(!ec && size == bytes, "{} {}: {} bytes, but {} bytes when it was written", tag, path,
              ec ? std::string("unknown") : std::to_string(size), bytes);
    if (position % share_count != share_index) continue;  // another process reads it
    const std::string expected = entry["crc32c"].get<std::string>();
    const std::string actual = hex(file_crc32c(path, tag).crc);
    MOE_CHECK(actual == expected,
              "{} {}: its CRC-32C is {}, but was {} when it was written (the file changed since)",
              tag, path, actual, escape_for_message(expected));
  }
  return true;
}

}  // namespace moecore::io
