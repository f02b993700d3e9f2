#include "io/hf_side_files.h"

#include <array>
#include <filesystem>

#include "core/check.h"
#include "io/file_util.h"

namespace moecore::io {

namespace {

constexpr std::array<const char*, 5> kSideFiles = {
    "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json"};

}  // namespace

std::map<std::string, std::string> read_hf_side_files(const std::string& dir, const char* tag) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> files;
  for (const char* name : kSideFiles) {
    const std::string path = dir + "/" + name;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);  // follows links (HF's cache links)
    if (status.type() == fs::file_type::not_found) continue;
    MOE_CHECK(status.type() == fs::file_type::regular, "{} {} is not a regular file", tag, path);
    files.emplace(name, read_text(path, tag));
  }
  return files;
}

void write_hf_side_files(const std::string& dir, const std::map<std::string, std::string>& files,
                         const char* tag) {
  for (const auto& [name, contents] : files) write_text_atomic(dir + "/" + name, contents, tag);
}

}  // namespace moecore::io
