#include "data/token_dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include "core/check.h"
#include "model/cross_entropy.h"

namespace moecore::data {

namespace {

namespace fs = std::filesystem;

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicSize = 6;

// Token dtypes: unsigned as moecore and OLMo-core write them, signed because np.save of a Python
// list of ints gives <i8 and some tools write <i4.
size_t token_itemsize(const std::string& dtype) {
  if (dtype == "<u2") return 2;
  if (dtype == "<u4" || dtype == "<i4") return 4;
  if (dtype == "<i8") return 8;
  return 0;
}

// Files named by `paths`, with directories replaced by their *.npy entries in sorted order so that
// the instance numbering, and hence the shuffle, does not depend on directory listing order.
std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      files.push_back(path);  // Missing files are reported when mapped.
      continue;
    }
    std::vector<std::string> found;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".npy" && it->is_regular_file()) {
        found.push_back(it->path().string());
      }
    }
    MOE_CHECK(!ec, "[data] {}: cannot list directory: {}", path, ec.message());
    MOE_CHECK(!found.empty(), "[data] {}: directory holds no .npy token files", path);
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

template <typename T>
int64_t load_token(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // .npy data need not be aligned to sizeof(T).
  return static_cast<int64_t>(value);
}

}  // namespace

TokenDataset::File TokenDataset::open_file(const std::string& path, const std::string& raw_dtype) {
  File file;
  file.path = path;
  io::MappedFile mapped = io::MappedFile::open(path, "[data]");
  const bool is_npy =
      mapped.size() >= kNpyMagicSize && std::memcmp(mapped.data(), kNpyMagic, kNpyMagicSize) == 0;
  if (is_npy) {
    file.npy.emplace(NpyFile::open(path));  // Validates header and data length.
    const NpyFile& npy = *file.npy;
    MOE_CHECK(npy.shape().size() == 1, "[data] {}: expected a flat 1-D token array, found shape {}",
              path, npy.shape());
    MOE_CHECK(token_itemsize(npy.dtype()) != 0,
              "[data] {}: unsupported token dtype '{}' (expected <u2, <u4, <i4 or <i8)", path,
              npy.dtype());
    file.dtype = npy.dtype();
    file.itemsize = npy.itemsize();
    file.data = static_cast<const std::byte*>(npy.data());
    file.num_tokens = static_cast<int64_t>(npy.numel());
  } else {
    file.dtype = raw_dtype;
    file.itemsize = token_itemsize(raw_dtype);
    MOE_CHECK(mapped.size() % file.itemsize == 0,
              "[data] {}: truncated: headerless token file of {} bytes is not a whole number of "
              "{}-byte '{}' tokens",
              path, mapped.size(), file.itemsize, raw_dtype);
    file.num_tokens = static_cast<int64_t>(mapped.size() / file.itemsize);
    file.raw = std::move(mapped);
    file.data = file.raw.data();
  }
  return file;
}

TokenDataset TokenDataset::open(const std::vector<std::string>& paths, int64_t seq_len,
                                int64_t vocab_size, const std::string& raw_dtype) {
  MOE_CHECK(seq_len >= 1, "[data] seq_len must be positive, got {}", seq_len);
  MOE_CHECK(vocab_size >= 1 && vocab_size <= int64_t{std::numeric_limits<int32_t>::max()} + 1,
            "[data] vocab_size={} is outside [1, 2^31]", vocab_size);
  MOE_CHECK(!paths.empty(), "[data] no token files given");
  const std::string dtype = !raw_dtype.empty() ? raw_dtype : vocab_size <= 65536 ? "<u2" : "<u4";
  MOE_CHECK(token_itemsize(dtype) != 0,
            "[data] unsupported raw token dtype '{}' (expected <u2, <u4, <i4 or <i8)", dtype);

  TokenDataset ds;
  ds.seq_len_ = seq_len;
  ds.vocab_size_ = vocab_size;
  for (const std::string& path : expand_paths(paths)) {
    File file = open_file(path, dtype);
    file.first_instance = ds.num_instances_;
    ds.num_instances_ += file.num_tokens / seq_len;
    ds.total_tokens_ += file.num_tokens;
    ds.files_.push_back(std::move(file));
  }
  MOE_CHECK(ds.num_instances_ > 0,
            "[data] {}: {} tokens in {} file(s) give no instance of seq_len={} (a file shorter "
            "than seq_len contributes nothing)",
            fmt::join(paths, ", "), ds.total_tokens_, ds.files_.size(), seq_len);
  return ds;
}

void TokenDataset::read_instance(int64_t index, int32_t* tokens) const {
  MOE_CHECK(index >= 0 && index < num_instances_, "[data] instance {} out of range [0, {})", index,
            num_instances_);
  // The last file whose first instance is <= index; files without instances share their
  // successor's first_instance and so are never the last such file for a valid index.
  const auto it = std::upper_bound(files_.begin(), files_.end(), index,
                                   [](int64_t i, const File& f) { return i < f.first_instance; });
  const File& file = *(it - 1);
  const int64_t start = (index - file.first_instance) * seq_len_;
  const std::byte* p = file.data + static_cast<size_t>(start) * file.itemsize;
  for (int64_t t = 0; t < seq_len_; ++t, p += file.itemsize) {
    int64_t id = 0;
    switch (file.itemsize) {
      case 2:
        id = load_token<uint16_t>(p);
        break;
      case 4:
        id = file.dtype == "<i4" ? load_token<int32_t>(p) : load_token<uint32_t>(p);
        break;
      default:
        id = load_token<int64_t>(p);
        break;
    }
    MOE_CHECK(id >= 0 && id < vocab_size_,
              "[data] {}: token id {} at position {} is outside the vocabulary [0, {})", file.path,
              id, start + t, vocab_size_);
    tokens[t] = static_cast<int32_t>(id);
  }
}

void TokenDataset::read_example(int64_t index, int32_t* tokens, int32_t* targets) const {
  read_instance(index, tokens);
  std::copy(tokens + 1, tokens + seq_len_, targets);
  targets[seq_len_ - 1] = kIgnoreIndex;  // No next token inside the instance.
}

// ---- DataLoader ------------------------------------------------------------------------------

DataLoader::DataLoader(const TokenDataset& dataset, uint64_t seed, uint64_t cursor)
    : dataset_(&dataset), order_(seed, dataset.num_instances()), cursor_(cursor) {}

void DataLoader::next_batch(int64_t batch, std::vector<int32_t>& tokens,
                            std::vector<int32_t>& targets) {
  MOE_CHECK(batch >= 1, "[data] batch size must be positive, got {}", batch);
  const int64_t T = dataset_->seq_len();
  tokens.resize(static_cast<size_t>(batch * T));
  targets.resize(static_cast<size_t>(batch * T));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t index = order_.instance_at(cursor_ + static_cast<uint64_t>(b));
    dataset_->read_example(index, tokens.data() + b * T, targets.data() + b * T);
  }
  // Only a complete batch moves the cursor, so a failed read can be retried or reported without
  // skipping data.
  cursor_ += static_cast<uint64_t>(batch);
}

// ---- ValidationBatches -----------------------------------------------------------------------

ValidationBatches::ValidationBatches(const TokenDataset& dataset, int64_t batch,
                                     int64_t max_instances)
    : dataset_(&dataset),
      batch_(batch),
      count_(max_instances <= 0 ? dataset.num_instances()
                                : std::min(max_instances, dataset.num_instances())) {
  MOE_CHECK(batch >= 1, "[data] validation batch size must be positive, got {}", batch);
}

int64_t ValidationBatches::next(std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  const int64_t rows = std::min(batch_, count_ - next_);
  const int64_t T = dataset_->seq_len();
  tokens.resize(static_cast<size_t>(rows * T));
  targets.resize(static_cast<size_t>(rows * T));
  for (int64_t r = 0; r < rows; ++r) {
    dataset_->read_example(next_ + r, tokens.data() + r * T, targets.data() + r * T);
  }
  next_ += rows;
  return rows;
}

}  // namespace moecore::data
