// Safetensors reader and writer: the weight interchange format shared with PyTorch/transformers.
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
// then the byte buffer that data_offsets index into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/file_util.h"

namespace moecore::io {

struct TensorInfo {
  std::string dtype;  // Safetensors spelling: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  size_t begin = 0;  // Byte range [begin, end) within the data buffer.
  size_t end = 0;
};

class SafetensorsReader {
 public:
  // Maps and validates the whole header; every inconsistency is an error naming the file, tagged
  // `tag` (the operation reading it: "[import]" for a Hugging Face model's shard).
  static SafetensorsReader open(const std::string& path, const char* tag = "[safetensors]");
  // The same on bytes in memory (fuzzing, tests); `origin` names them in errors.
  static SafetensorsReader from_bytes(std::vector<std::byte> bytes, const std::string& origin);

  SafetensorsReader(SafetensorsReader&&) noexcept = default;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept = default;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader() = default;

  std::vector<std::string> names() const;  // Sorted.
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Copies tensor `name`, which must have exactly `expected_shape` and dtype F32, BF16 or F16, into
  // dst as float. dst may be in a device's memory (core/device_memory.h): the reads copy into it
  // through the device.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                float* dst) const;
  std::vector<float> read_f32(const std::string& name) const;  // Any shape.
  // Elements [first, first + count) of the flattened tensor `name` (F32, BF16 or F16) as float:
  // a rank reads its slice of a tensor without touching the rest of the file.
  void read_f32_elements(const std::string& name, size_t first, size_t count, float* dst) const;

 private:
  SafetensorsReader() = default;
  void parse(const std::byte* base, size_t size);  // fills buffer_, tensors_, metadata_

  std::string path_;
  const char* tag_ = "[safetensors]";
  MappedFile file_;
  std::vector<std::byte> owned_;       // from_bytes' copy (a moved vector keeps its data in place)
  const std::byte* buffer_ = nullptr;  // Start of the data buffer inside file_.
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Adds numel(shape) floats at data, in host or a device's memory (core/device_memory.h), without
  // copying them: they must stay valid and unchanged until write() returns. A checkpoint therefore
  // costs no second copy of the weights and optimizer state in memory (device tensors pass through
  // one host buffer, a tensor at a time). Duplicate names are an error.
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  // The same for values the writer keeps (a scalar, a temporary).
  void add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float> values);
  void set_metadata(const std::string& key, const std::string& value);
  // write() refuses a NaN or infinity in any tensor (before the file replaces anything): a
  // checkpoint of weights that are no longer numbers would push the run's good ones out.
  void require_finite() { require_finite_ = true; }
  // Atomic (see write_file_atomic). Header keys sorted, header padded with spaces to a multiple of
  // 8 bytes as the Python safetensors package does, so F32 data stays aligned.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    size_t numel = 0;
    const float* borrowed = nullptr;  // the caller's values, or
    std::vector<float> owned;         // the writer's
    const float* values() const { return owned.empty() ? borrowed : owned.data(); }
  };
  // numel(shape), after checking the name (not empty, not taken) and the shape.
  size_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) const;

  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  bool require_finite_ = false;
};

}  // namespace moecore::io
