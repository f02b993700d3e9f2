// Safetensors reader and writer: the weight interchange format shared with PyTorch/transformers.
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
// then the byte buffer that data_offsets index into.
//
// MappedFile and write_file_atomic are the file plumbing this format needs; data/npy uses them too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace moecore::io {

// Read-only memory map of a whole file. Move-only; unmaps on destruction. `tag` ("[npy]") prefixes
// the error thrown when the file cannot be opened or mapped.
class MappedFile {
 public:
  static MappedFile open(const std::string& path, const char* tag);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return static_cast<const std::byte*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;  // nullptr for an empty file: mmap cannot map zero bytes.
  size_t size_ = 0;
};

// Writes the concatenated chunks to `path` so that readers see either the old file or the complete
// new one: write `path.tmp.<pid>`, fsync, rename over `path`, fsync the directory. On failure the
// temporary is removed, `path` is untouched, and a one-line moecore::Error names path and strerror.
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> chunks,
                       const char* tag);

// Test hook: after `bytes` more bytes, write_file_atomic's writes fail with ENOSPC (disk full),
// which root cannot otherwise provoke with permissions. A negative value disables the fault.
void set_write_failure_for_testing(int64_t bytes);

struct TensorInfo {
  std::string dtype;  // Safetensors spelling: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  size_t begin = 0;  // Byte range [begin, end) within the data buffer.
  size_t end = 0;
};

class SafetensorsReader {
 public:
  // Maps and validates the whole header; every inconsistency is an error naming the file.
  static SafetensorsReader open(const std::string& path);

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
  // dst as float.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                float* dst) const;
  std::vector<float> read_f32(const std::string& name) const;  // Any shape.

 private:
  SafetensorsReader() = default;

  std::string path_;
  MappedFile file_;
  const std::byte* buffer_ = nullptr;  // Start of the data buffer inside file_.
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Copies numel(shape) floats from data. Duplicate names are an error.
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value);
  // Atomic (see write_file_atomic). Header keys sorted, header padded with spaces to a multiple of
  // 8 bytes as the Python safetensors package does, so F32 data stays aligned.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moecore::io
