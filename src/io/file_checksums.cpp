#include "io/file_checksums.h"

#include <fmt/format.h>

#include <algorithm>
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

uint32_t file_crc32c(const std::string& path, const char* tag) {
  const MappedFile file = MappedFile::open(path, tag);
  return crc32c({file.data(), file.size()});
}

std::string hex(uint32_t value) {
  return fmt::format("{:08x}", value);
}

}  // namespace

void write_checksums(const std::string& dir, const std::string& manifest, const char* tag) {
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
    const MappedFile file = MappedFile::open(path, tag);
    files[name] = {{"bytes", file.size()}, {"crc32c", hex(crc32c({file.data(), file.size()}))}};
  }
  const nlohmann::json doc = {{"algorithm", kAlgorithm}, {"files", files}};
  write_text_atomic(dir + "/" + manifest, doc.dump(1) + "\n", tag);
}

bool verify_checksums(const std::string& dir, const std::string& manifest, const char* tag) {
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
  for (const auto& [name, entry] : doc["files"].items()) {
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
    const std::string expected = entry["crc32c"].get<std::string>();
    const std::string actual = hex(file_crc32c(path, tag));
    MOE_CHECK(actual == expected,
              "{} {}: its CRC-32C is {}, but was {} when it was written (the file changed since)",
              tag, path, actual, escape_for_message(expected));
  }
  return true;
}

}  // namespace moecore::io
