#include "io/tensor_parts.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file_util.h"

namespace moecore::io {

std::string part_file_name(const std::string& stem, int64_t index, int64_t count) {
  if (count == 1) return stem + ".safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "-%05lld-of-%05lld.safetensors",
                static_cast<long long>(index + 1), static_cast<long long>(count));
  return stem + name;
}

void write_part_index(const std::string& dir, const std::string& stem,
                      const std::map<std::string, std::string>& weight_map, int64_t total_bytes) {
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  const std::span<const std::byte> chunks[] = {bytes};
  write_file_atomic(dir + "/" + stem + ".safetensors.index.json", chunks, "[checkpoint]");
}

TensorParts TensorParts::open(const std::string& dir, const std::string& stem, const char* tag) {
  TensorParts set;
  set.tag_ = tag;
  const std::string single = dir + "/" + stem + ".safetensors";
  const std::string index_path = single + ".index.json";
  if (std::filesystem::exists(single) || !std::filesystem::exists(index_path)) {
    set.origin_ = single;
    set.parts_.push_back(SafetensorsReader::open(single, tag));
    for (const std::string& name : set.parts_.back().names()) set.where_[name] = 0;
    return set;
  }
  set.origin_ = index_path;
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(index_path, tag));
  } catch (const nlohmann::json::exception& e) {
    fail("{} {}: malformed index: {}", tag, index_path, e.what());
  }
  MOE_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "{} {}: no weight_map",
            tag, index_path);
  std::map<std::string, size_t> file_slot;
  for (const auto& [name, file] : index["weight_map"].items()) {
    MOE_CHECK(file.is_string(), "{} {}: weight_map['{}'] is not a file name", tag, index_path,
              name);
    const std::string part = file.get<std::string>();
    MOE_CHECK(part.find('/') == std::string::npos, "{} {}: part '{}' is not a file name", tag,
              index_path, part);
    auto it = file_slot.find(part);
    if (it == file_slot.end()) {
      // Named here, the index is what to fix (or the download to finish): the part's own open
      // error would name only a path that is not there.
      const std::string path = dir + "/" + part;
      MOE_CHECK(std::filesystem::exists(path),
                "{} {}: weight_map puts tensor '{}' in {}, which does not exist", tag, index_path,
                name, path);
      it = file_slot.emplace(part, set.parts_.size()).first;
      set.parts_.push_back(SafetensorsReader::open(path, tag));
    }
    MOE_CHECK(set.parts_[it->second].has(name), "{} {}: tensor '{}' is not in {}", tag, index_path,
              name, part);
    set.where_[name] = it->second;
  }
  MOE_CHECK(!set.parts_.empty(), "{} {}: the index lists no tensors", tag, index_path);
  for (const auto& [part, slot] : file_slot)
    for (const std::string& name : set.parts_[slot].names())
      MOE_CHECK(set.where_.count(name) != 0 && set.where_.at(name) == slot,
                "{} {}: tensor '{}' in {} is not listed there by the index (unused)", tag,
                index_path, name, part);
  return set;
}

std::vector<std::string> TensorParts::names() const {
  std::vector<std::string> names;
  for (const auto& [name, slot] : where_) names.push_back(name);
  return names;
}

void TensorParts::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                           float* dst) const {
  const auto it = where_.find(name);
  MOE_CHECK(it != where_.end(), "{} {}: missing tensor '{}'", tag_, origin_, name);
  parts_[it->second].read_f32(name, shape, dst);
}

void TensorParts::read_f32_elements(const std::string& name, size_t first, size_t count,
                                    float* dst) const {
  const auto it = where_.find(name);
  MOE_CHECK(it != where_.end(), "{} {}: missing tensor '{}'", tag_, origin_, name);
  parts_[it->second].read_f32_elements(name, first, count, dst);
}

const TensorInfo& TensorParts::info(const std::string& name) const {
  const auto it = where_.find(name);
  MOE_CHECK(it != where_.end(), "{} {}: missing tensor '{}'", tag_, origin_, name);
  return parts_[it->second].info(name);
}

const std::string& TensorParts::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  MOE_CHECK(it != where_.end(), "{} {}: missing tensor '{}'", tag_, origin_, name);
  return parts_[it->second].path();
}

}  // namespace moecore::io
