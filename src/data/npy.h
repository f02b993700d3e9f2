// NumPy .npy files (format versions 1.0 and 2.0): token streams and small arrays exchanged with
// Python tooling. Only little-endian, C-order arrays of the dtypes moecore uses are accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/file_util.h"

namespace moecore::data {

class NpyFile {
 public:
  // Maps the file and validates header, dtype and data length; errors name the file.
  static NpyFile open(const std::string& path);

  NpyFile(NpyFile&&) noexcept = default;
  NpyFile& operator=(NpyFile&&) noexcept = default;
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;
  ~NpyFile() = default;

  const std::string& dtype() const { return descr_; }  // NumPy descr, e.g. "<u2".
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t numel() const { return numel_; }
  size_t itemsize() const { return itemsize_; }
  const std::string& path() const { return path_; }

  // Element i widened to int64; integer dtypes only.
  int64_t int_at(size_t i) const;
  // All elements widened to int64; integer dtypes only. Resizes out to numel().
  void read_ints(std::vector<int64_t>& out) const;
  // The raw little-endian elements, numel() * itemsize() bytes, valid while this object lives.
  const void* data() const { return data_; }

 private:
  NpyFile() = default;

  std::string path_;
  io::MappedFile file_;
  const std::byte* data_ = nullptr;
  std::string descr_;
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  size_t itemsize_ = 0;
  bool is_integer_ = false;
};

// Writes a C-order array with descr '|u1', '<u2', '<u4', '<i4', '<i8' or '<f4' atomically (temp
// file, fsync, rename), as io::write_file_atomic does.
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data);

}  // namespace moecore::data
