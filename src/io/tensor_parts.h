// A set of tensors stored as one safetensors file (<stem>.safetensors) or, when several ranks each
// write their part, as <stem>-0000i-of-0000n.safetensors files listed by a Hugging Face style index
// <stem>.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}),
// which transformers' from_pretrained reads too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace moecore::io {

// "model.safetensors" for a single part, else "model-00001-of-00004.safetensors" (index 0-based).
std::string part_file_name(const std::string& stem, int64_t index, int64_t count);

// Writes <dir>/<stem>.safetensors.index.json (atomically).
void write_part_index(const std::string& dir, const std::string& stem,
                      const std::map<std::string, std::string>& weight_map, int64_t total_bytes);

class TensorParts {
 public:
  // Opens <dir>/<stem>.safetensors, or the parts its index lists; every part must exist and open,
  // every indexed tensor must be in the part the index names, and every tensor of a part must be
  // indexed (a tensor the index leaves out would otherwise be silently unused). Errors, the
  // parts' own included, carry `tag`: the operation reading them ("[import]", "[checkpoint]").
  static TensorParts open(const std::string& dir, const std::string& stem, const char* tag);

  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  // Elements [first, first + count) of the flattened tensor (SafetensorsReader::read_f32_elements).
  void read_f32_elements(const std::string& name, size_t first, size_t count, float* dst) const;
  const TensorInfo& info(const std::string& name) const;
  // The file that holds tensor `name`.
  const std::string& file_of(const std::string& name) const;
  // Metadata of the first part (every part carries the same).
  const std::map<std::string, std::string>& metadata() const { return parts_.front().metadata(); }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  const char* tag_ = nullptr;
  std::vector<SafetensorsReader> parts_;
  std::map<std::string, size_t> where_;
};

}  // namespace moecore::io
