// Token files cut into training instances, OLMo-core's "concat and chunk" layout: each file is a
// flat stream of token ids (documents already joined by EOS) and is cut into consecutive,
// non-overlapping instances of exactly seq_len tokens; a file's tail shorter than seq_len is
// dropped, so no instance spans two files. The model is trained on tokens = inst[0:T] and
// targets = inst[1:T] followed by -100 (ignored), as OLMo-core does.
//
// Files are memory-mapped, never read whole. Two on-disk forms are accepted:
//  * real .npy files (magic "\x93NUMPY", 1-D, dtype <u2, <u4, <i4 or <i8), as `moecore prepare` and
//    np.save write them;
//  * headerless token streams, which is what OLMo-core and Dolma actually write under the .npy
//    extension (np.memmap(..., mode="w+")): their dtype is not stored in the file, so it is given
//    by the caller (raw_dtype), by default uint16 when vocab_size <= 65536 else uint32.
// Ids are checked against the vocabulary lazily, when an instance is read, so that opening a
// multi-gigabyte corpus costs nothing; a bad id is reported with its file and position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/instance_order.h"
#include "data/npy.h"
#include "io/file_util.h"

namespace moecore::data {

class TokenDataset {
 public:
  // `paths`: files, or directories whose *.npy entries (not recursive) are taken in byte-wise
  // sorted name order. `raw_dtype` ("<u2", "<u4", "<i4", "<i8"; empty = by vocab_size) applies to
  // headerless files only. Errors (missing file, unsupported dtype or rank, truncated data, no
  // instance at all) are one-line moecore::Error naming the file.
  static TokenDataset open(const std::vector<std::string>& paths, int64_t seq_len,
                           int64_t vocab_size, const std::string& raw_dtype = "");

  TokenDataset(TokenDataset&&) noexcept = default;
  TokenDataset& operator=(TokenDataset&&) noexcept = default;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset() = default;

  int64_t num_instances() const { return num_instances_; }
  // Every token in the files, including the dropped tails.
  int64_t total_tokens() const { return total_tokens_; }
  // Tokens covered by instances: num_instances() * seq_len().
  int64_t instance_tokens() const { return num_instances_ * seq_len_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  size_t num_files() const { return files_.size(); }
  const std::string& file_path(size_t i) const { return files_[i].path; }

  // Copies instance `index` (0 <= index < num_instances(), file order) into tokens[0:seq_len].
  void read_instance(int64_t index, int32_t* tokens) const;
  // tokens[0:T] = instance, targets[0:T-1] = instance[1:T], targets[T-1] = -100.
  void read_example(int64_t index, int32_t* tokens, int32_t* targets) const;

 private:
  struct File {
    std::string path;
    std::optional<NpyFile> npy;  // Set for real .npy files; keeps their mapping alive.
    io::MappedFile raw;          // Set for headerless files.
    const std::byte* data = nullptr;
    std::string dtype;  // "<u2", "<u4", "<i4" or "<i8".
    size_t itemsize = 0;
    int64_t num_tokens = 0;
    int64_t first_instance = 0;  // Global index of this file's first instance.
  };

  TokenDataset() = default;
  static File open_file(const std::string& path, const std::string& raw_dtype);

  std::vector<File> files_;
  int64_t seq_len_ = 0;
  int64_t vocab_size_ = 0;
  int64_t num_instances_ = 0;
  int64_t total_tokens_ = 0;
};

// Training batches in the shuffled order of an InstanceOrder, starting at a saved cursor. The
// cursor after next_batch() is what a checkpoint stores; a loader rebuilt from it with the same
// dataset and seed yields exactly the batches the uninterrupted run would have seen. Holds a
// reference to `dataset`, which must outlive it.
class DataLoader {
 public:
  DataLoader(const TokenDataset& dataset, uint64_t seed, uint64_t cursor = 0);

  // Fills tokens and targets, resized to [batch, seq_len] row-major, with the next `batch`
  // instances (crossing into the next epoch's shuffle when needed) and advances the cursor.
  void next_batch(int64_t batch, std::vector<int32_t>& tokens, std::vector<int32_t>& targets);

  uint64_t cursor() const { return cursor_; }
  uint64_t epoch() const { return order_.epoch_of(cursor_); }
  const InstanceOrder& order() const { return order_; }

 private:
  const TokenDataset* dataset_;
  InstanceOrder order_;
  uint64_t cursor_;
};

// Validation batches: the first `max_instances` instances in file order (all of them when
// max_instances <= 0 or larger than the dataset), never shuffled, so every evaluation of every run
// scores the same tokens. The last batch may hold fewer rows.
class ValidationBatches {
 public:
  ValidationBatches(const TokenDataset& dataset, int64_t batch, int64_t max_instances = 0);

  // Fills the next batch ([rows, seq_len] each) and returns rows; 0 when exhausted.
  int64_t next(std::vector<int32_t>& tokens, std::vector<int32_t>& targets);
  void reset() { next_ = 0; }
  int64_t num_instances() const { return count_; }

 private:
  const TokenDataset* dataset_;
  int64_t batch_;
  int64_t count_;
  int64_t next_ = 0;
};

}  // namespace moecore::data
