// Token files cut into training instances, OLMo-core's "concat and chunk" layout: each file is a
// flat stream of token ids (documents already joined by EOS) and is cut into consecutive,
// non-overlapping instances of exactly seq_len tokens; a file's tail shorter than seq_len (or
// than max_target_seq_len, below) is dropped, so no instance spans two files. The model is trained
// on tokens = inst[0:T] and targets = inst[1:T] followed by -100 (ignored), as OLMo-core does.
//
// Files are memory-mapped, never read whole. Two on-disk forms are accepted:
//  * headerless token streams, what OLMo-core and Dolma write under the .npy extension
//    (np.memmap(..., mode="w+")) and what `moecore prepare` writes by default. The file does not
//    say its element type, so it comes from the caller's declaration (data.dtype, --dtype) or
//    from the meta.json `moecore prepare` writes (in the file's directory or the one above, and
//    listing the file). Neither: an error, never a guess (a uint32 stream read as uint16 gives
//    twice the instances with zeros interleaved, and nothing fails);
//  * real .npy files (magic "\x93NUMPY", 1-D, dtype <u2, <u4, <i4 or <i8), as np.save and
//    `moecore prepare --npy-header` write them: the header says the type.
// Ids are checked against the vocabulary lazily, when an instance is read, so that opening a
// multi-gigabyte corpus costs nothing; a bad id is reported with its file and position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/instance_filter.h"
#include "data/instance_order.h"
#include "data/npy.h"
#include "io/file_util.h"

namespace moecore::data {

// Token element types by their NumPy names ("uint16", "uint32", "int32", "int64"; OLMo-core's
// NumpyDatasetDType spells them the same) or descrs ("<u2", ...): the descr, "" when unknown.
std::string token_dtype_descr(std::string_view name_or_descr);
// "<u2" -> "uint16", ...; "" when unknown.
std::string token_dtype_name(std::string_view descr);

// What the meta.json written by `moecore prepare` says about one token file.
struct TokenFileMeta {
  std::string meta_path;  // the meta.json
  std::string dtype;      // descr, "" when it does not say
  int64_t eos_id = -1;    // -1 when it does not say
};

// Whether `max_target_seq_len` may cut instances of `seq_len` (0: none; else a positive multiple
// of seq_len, as OLMo-core's NumpyFSLDataset requires).
inline bool is_max_target_seq_len(int64_t max_target_seq_len, int64_t seq_len) {
  return max_target_seq_len == 0 ||
         (max_target_seq_len >= seq_len && max_target_seq_len % seq_len == 0);
}

class TokenDataset {
 public:
  // `paths`: files, or directories whose *.npy entries (not recursive) are taken in byte-wise
  // sorted name order. `declared_dtype` (data.dtype, --dtype: "uint16", "uint32", "int32",
  // "int64"; empty = undeclared) is the element type of headerless files; a file's meta.json that
  // says otherwise is an error, and so is a headerless file with neither. Errors (missing file,
  // unsupported dtype or rank, truncated data, no instance at all) are one-line moecore::Error
  // naming the file.
  // `max_target_seq_len` (OLMo-core's max_target_sequence_length; 0: seq_len): a multiple of
  // seq_len; each file is cut into whole blocks of that many tokens (its tail beyond the last
  // dropped), each block into max_target_seq_len / seq_len consecutive instances, so that runs
  // of other seq_len up to it (a sequence-length warm-up) read the same tokens.
  // `label_mask_paths` (OLMo-core's label_mask_paths; empty: none): one label mask per token
  // file after `paths` are expanded, in the same order (directories expand alike), each a flat
  // array of 0 / 1 bytes (headerless as OLMo-core writes np.bool_ arrays, or a .npy of |b1 or
  // |u1) as long as its token file: a token whose mask is 0 is no label (read_example).
  static TokenDataset open(const std::vector<std::string>& paths, int64_t seq_len,
                           int64_t vocab_size, const std::string& declared_dtype = "",
                           int64_t max_target_seq_len = 0,
                           const std::vector<std::string>& label_mask_paths = {});

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
  // The consecutive instances of one max_target_seq_len block (1 without one): OLMo-core's
  // loader shuffles such chunks whole (its chunk_size).
  int64_t instances_per_chunk() const { return instances_per_chunk_; }
  int64_t vocab_size() const { return vocab_size_; }
  size_t num_files() const { return files_.size(); }
  const std::string& file_path(size_t i) const { return files_[i].path; }
  // The element type each file was read as ("<u2", ...).
  const std::string& file_dtype(size_t i) const { return files_[i].dtype; }
  // The EOS id the files' meta.json give (all that give one agree, else open() fails); -1 when
  // none does.
  int64_t metadata_eos_id() const { return metadata_eos_id_; }

  // Copies instance `index` (0 <= index < num_instances(), file order) into tokens[0:seq_len].
  void read_instance(int64_t index, int32_t* tokens) const;
  // The tokens of file `file` (all of them, its dropped tail included).
  int64_t file_tokens(size_t file) const { return files_[file].num_tokens; }
  // Copies tokens [start, start + count) of file `file` into tokens[0:count], each checked
  // against the vocabulary.
  void read_tokens(size_t file, int64_t start, int64_t count, int32_t* tokens) const;
  // tokens[0:T] = instance, targets[0:T-1] = instance[1:T], targets[T-1] = -100; with label
  // masks, targets[t] = -100 also where instance[t + 1]'s mask is 0 (OLMo-core's get_labels
  // masks the label, then shifts). (open() refuses a mask byte other than 0 or 1.)
  void read_example(int64_t index, int32_t* tokens, int32_t* targets) const;
  bool has_label_masks() const { return has_label_masks_; }
  // Copies label mask values [start, start + count) of file `file` (0 / 1) into mask[0:count];
  // needs label masks.
  void read_label_mask(size_t file, int64_t start, int64_t count, uint8_t* mask) const;

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
    // Its label mask (open()'s label_mask_paths), num_tokens bytes.
    std::string mask_path;
    std::optional<NpyFile> mask_npy;
    io::MappedFile mask_raw;
    const uint8_t* mask = nullptr;
  };

  TokenDataset() = default;
  static File open_file(const std::string& path, const std::string& declared_dtype,
                        const std::optional<TokenFileMeta>& meta);
  static void open_label_mask(File& file, const std::string& path);
  const File& file_of(int64_t index) const;

  std::vector<File> files_;
  int64_t metadata_eos_id_ = -1;
  int64_t seq_len_ = 0;
  int64_t instances_per_chunk_ = 1;
  int64_t vocab_size_ = 0;
  int64_t num_instances_ = 0;
  int64_t total_tokens_ = 0;
  bool has_label_masks_ = false;
};

// Training batches in the shuffled order of an InstanceOrder, starting at a saved cursor. The
// cursor after next_batch() is what a checkpoint stores; a loader rebuilt from it with the same
// dataset and order yields exactly the batches the uninterrupted run would have seen. Holds a
// reference to `dataset`, which must outlive it.
//
// A batch of rows is dealt to `dp_ranks` data-parallel ranks as contiguous slices (rank r keeps
// rows [r * rows / dp, (r + 1) * rows / dp)). Under moecore's order the rows follow the cursor;
// under OLMo-core's, row r * (rows / dp) + j is the instance at cursor + r + dp * j, so that each
// rank's slice holds what OLMo-core's loader gives that rank (every dp-th instance of the global
// batch, from the r-th; data/order_rule.h).
class DataLoader {
 public:
  DataLoader(const TokenDataset& dataset, InstanceOrder order, uint64_t cursor = 0,
             int64_t dp_ranks = 1);

  // Fills tokens and targets, resized to [batch, seq_len] row-major, with the next `batch`
  // instances (crossing into the next epoch's order when needed) and advances the cursor.
  // Returns the instance each row holds, valid until the next call.
  std::span<const int64_t> next_batch(int64_t batch, std::vector<int32_t>& tokens,
                                      std::vector<int32_t>& targets);

  // OLMo-core's instance filter (data/instance_filter.h): from the next batch on, a row whose
  // instance it masks has every target ignored.
  void set_instance_filter(const RepetitionFilter& filter) { filter_ = filter; }
  // The last batch's rows the filter masked (1) or kept (0); empty without a filter.
  std::span<const uint8_t> masked_rows() const { return masked_; }

  uint64_t cursor() const { return cursor_; }
  uint64_t epoch() const { return order_.epoch_of(cursor_); }
  const InstanceOrder& order() const { return order_; }

 private:
  const TokenDataset* dataset_;
  InstanceOrder order_;
  uint64_t cursor_;
  int64_t dp_ranks_;
  std::vector<int64_t> rows_;  // the last batch's instances, kept: no allocation per batch
  std::optional<RepetitionFilter> filter_;
  std::vector<uint8_t> masked_;
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
