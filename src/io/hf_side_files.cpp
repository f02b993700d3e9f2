#include "io/hf_side_files.h"

#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file_util.h"
#include "io/hf_config_reader.h"

namespace moecore::io {

namespace {

constexpr std::array<const char*, 5> kSideFiles = {
    "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json"};

}  // namespace

std::optional<std::vector<int32_t>> generation_config_eos_token_ids(const std::string& text,
                                                                    const std::string& origin,
                                                                    int64_t vocab_size,
                                                                    const char* tag) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{} {}: not JSON ({})", tag, origin, e.what());
  }
  if (!j.is_object() || !j.contains("eos_token_id")) return std::nullopt;
  return eos_token_ids_from_json(j["eos_token_id"], origin, vocab_size, tag);
}

std::map<std::string, std::string> read_hf_side_files(const std::string& dir, int64_t vocab_size,
                                                      const char* tag) {
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
  if (const auto it = files.find("generation_config.json"); it != files.end())
    (void)generation_config_eos_token_ids(it->second, dir + "/" + it->first, vocab_size, tag);
  return files;
}

void write_hf_side_files(const std::string& dir, const std::map<std::string, std::string>& files,
                         const char* tag) {
  for (const auto& [name, contents] : files) write_text_atomic(dir + "/" + name, contents, tag);
}

}  // namespace moecore::io
