#include "data/token_dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/check.h"
#include "core/ignore_index.h"

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
// `what` the files are, for the error of a directory without any.
std::vector<std::string> expand_paths(const std::vector<std::string>& paths,
                                      const char* what = "token files") {
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
    MOE_CHECK(!found.empty(), "[data] {}: directory holds no .npy {}", path, what);
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// meta.json candidates for a token file: its own directory (a flat corpus), then the one above
// (moecore's layout: out/meta.json describing out/train/part-*.npy).
std::vector<fs::path> meta_candidates(const fs::path& file) {
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  return {dir / "meta.json", dir / ".." / "meta.json"};
}

// The meta.json files of one TokenDataset::open, each read once: a corpus of thousands of parts
// shares one meta.json listing them all.
class TokenMetaCache {
 public:
  std::optional<TokenFileMeta> find(const std::string& file) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(file, ec).string();
    for (const fs::path& candidate : meta_candidates(fs::path(file))) {
      const fs::file_status status = fs::status(candidate, ec);
      if (!fs::exists(status)) continue;
      // Something else by that name (a directory): the metadata is lost, not absent.
      MOE_CHECK(fs::is_regular_file(status),
                "[data] {}: not a regular file (the token metadata of {} is read from it)",
                candidate.lexically_normal().string(), file);
      const Parsed& parsed = load(candidate, file);
      // Another tool's meta.json, or one that describes other files, says nothing about this one.
      if (parsed.is_token_meta && parsed.files.count(key) != 0) return parsed.meta;
    }
    return std::nullopt;
  }

 private:
  struct Parsed {
    bool is_token_meta = false;
    TokenFileMeta meta;
    std::set<std::string> files;  // canonical paths of the files it lists
  };

  const Parsed& load(const fs::path& candidate, const std::string& file) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(candidate, ec).string();
    if (const auto it = parsed_.find(key); it != parsed_.end()) return it->second;
    Parsed& parsed = parsed_[key];
    std::ifstream in(candidate, std::ios::binary);
    MOE_CHECK(in.good(), "[data] cannot open {}", candidate.string());
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json meta;
    try {
      meta = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      fail("[data] {}: not valid JSON (token metadata of {}): {}", candidate.string(), file,
           e.what());
    }
    if (!meta.is_object() || meta.value("format", "") != "moecore-tokens") return parsed;
    parsed.is_token_meta = true;
    TokenFileMeta& found = parsed.meta;
    found.meta_path = candidate.lexically_normal().string();
    if (meta.contains("dtype")) {
      MOE_CHECK(meta["dtype"].is_string(), "[data] {}: \"dtype\" must be a string",
                found.meta_path);
      found.dtype = token_dtype_descr(meta["dtype"].get<std::string>());
      MOE_CHECK(!found.dtype.empty(),
                "[data] {}: unsupported token dtype '{}' (expected uint16, uint32, int32 or int64)",
                found.meta_path, meta["dtype"].get<std::string>());
    }
    if (meta.contains("eos_id")) {
      MOE_CHECK(meta["eos_id"].is_number_integer() && meta["eos_id"].get<int64_t>() >= 0,
                "[data] {}: \"eos_id\" must be a non-negative integer", found.meta_path);
      found.eos_id = meta["eos_id"].get<int64_t>();
    }
    // Every "files" array (one per split), paths relative to the meta.json's directory.
    for (const auto& [name, split] : meta.items()) {
      if (!split.is_object() || !split.contains("files") || !split["files"].is_array()) continue;
      for (const nlohmann::json& listed : split["files"]) {
        if (!listed.is_string()) continue;
        parsed.files.insert(
            fs::weakly_canonical(candidate.parent_path() / listed.get<std::string>(), ec).string());
      }
    }
    return parsed;
  }

  std::map<std::string, Parsed> parsed_;
};

template <typename T>
int64_t load_token(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // .npy data need not be aligned to sizeof(T).
  return static_cast<int64_t>(value);
}

}  // namespace

std::string token_dtype_descr(std::string_view name) {
  if (name == "uint16" || name == "<u2") return "<u2";
  if (name == "uint32" || name == "<u4") return "<u4";
  if (name == "int32" || name == "<i4") return "<i4";
  if (name == "int64" || name == "<i8") return "<i8";
  return "";
}

std::string token_dtype_name(std::string_view descr) {
  if (descr == "<u2") return "uint16";
  if (descr == "<u4") return "uint32";
  if (descr == "<i4") return "int32";
  if (descr == "<i8") return "int64";
  return "";
}

TokenDataset::File TokenDataset::open_file(const std::string& path,
                                           const std::string& declared_dtype,
                                           const std::optional<TokenFileMeta>& meta) {
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
    // Headerless: the declaration and the metadata must agree, and one of them must exist.
    const std::string meta_dtype = meta ? meta->dtype : "";
    MOE_CHECK(declared_dtype.empty() || meta_dtype.empty() || declared_dtype == meta_dtype,
              "[data] {}: data.dtype={} but {} says dtype={}", path,
              token_dtype_name(declared_dtype), meta->meta_path, token_dtype_name(meta_dtype));
    file.dtype = !declared_dtype.empty() ? declared_dtype : meta_dtype;
    MOE_CHECK(!file.dtype.empty(),
              "[data] {}: headerless token file of unknown element type: declare it with "
              "data.dtype (or --dtype) = uint16 or uint32, or keep the meta.json `moecore prepare` "
              "wrote beside it",
              path);
    file.itemsize = token_itemsize(file.dtype);
    // The type is a declaration nothing in the file confirms: its errors name it as a suspect.
    const std::string type_origin =
        !declared_dtype.empty() ? "data.dtype (--dtype)" : meta->meta_path;
    MOE_CHECK(mapped.size() % file.itemsize == 0,
              "[data] {}: headerless token file of {} bytes is not a whole number of {}-byte {} "
              "tokens: truncated, or its elements are not {} (as {} says)",
              path, mapped.size(), file.itemsize, token_dtype_name(file.dtype),
              token_dtype_name(file.dtype), type_origin);
    file.num_tokens = static_cast<int64_t>(mapped.size() / file.itemsize);
    if (file.dtype == "<u2") {
      // uint32 ids below 65536 read as uint16 are the ids with a 0 after each (little-endian):
      // twice the instances, every other token 0, and nothing out of range to stop it. Refused
      // when the file's first 8192 elements look so (no text has token 0 at every odd place).
      constexpr int64_t kLooked = 8192, kEnough = 512;
      const int64_t looked = std::min(file.num_tokens, kLooked) & ~int64_t{1};
      bool odd_all_zero = looked >= kEnough, even_any_nonzero = false;
      for (int64_t i = 0; i < looked && odd_all_zero; i += 2) {
        even_any_nonzero |= load_token<uint16_t>(mapped.data() + 2 * i) != 0;
        odd_all_zero = load_token<uint16_t>(mapped.data() + 2 * (i + 1)) == 0;
      }
      MOE_CHECK(!(odd_all_zero && even_any_nonzero),
                "[data] {}: read as uint16 (as {} says), every other one of its first {} tokens "
                "is 0: its elements look like uint32; declare the file's type",
                path, type_origin, looked);
    }
    file.raw = std::move(mapped);
    file.data = file.raw.data();
  }
  return file;
}

void TokenDataset::open_label_mask(File& file, const std::string& path) {
  file.mask_path = path;
  io::MappedFile mapped = io::MappedFile::open(path, "[data]");
  size_t count = mapped.size();
  if (mapped.size() >= kNpyMagicSize && std::memcmp(mapped.data(), kNpyMagic, kNpyMagicSize) == 0) {
    file.mask_npy.emplace(NpyFile::open(path));
    const NpyFile& npy = *file.mask_npy;
    MOE_CHECK(npy.shape().size() == 1 && (npy.dtype() == "|b1" || npy.dtype() == "|u1"),
              "[data] {}: a label mask is a flat array of bool or uint8, found {} of shape {}",
              path, npy.dtype(), npy.shape());
    count = npy.numel();
    file.mask = static_cast<const uint8_t*>(npy.data());
  } else {
    file.mask_raw = std::move(mapped);
    file.mask = reinterpret_cast<const uint8_t*>(file.mask_raw.data());
  }
  // OLMo-core's NumpyFSLDataset checks the same sizes.
  MOE_CHECK(static_cast<int64_t>(count) == file.num_tokens,
            "[data] {}: a label mask of {} elements for the {} tokens of {}", path, count,
            file.num_tokens, file.path);
  // Every value, once: a 2 would read as true in numpy and as something else elsewhere.
  const uint8_t* bad =
      std::find_if(file.mask, file.mask + count, [](uint8_t value) { return value > 1; });
  MOE_CHECK(bad == file.mask + count, "[data] {}: label mask value {} at position {} is not 0 or 1",
            path, *bad, bad - file.mask);
}

TokenDataset TokenDataset::open(const std::vector<std::string>& paths, int64_t seq_len,
                                int64_t vocab_size, const std::string& declared_dtype,
                                int64_t max_target_seq_len,
                                const std::vector<std::string>& label_mask_paths) {
  MOE_CHECK(seq_len >= 1, "[data] seq_len must be positive, got {}", seq_len);
  // OLMo-core's NumpyFSLDataset refuses the same.
  MOE_CHECK(is_max_target_seq_len(max_target_seq_len, seq_len),
            "[data] max_target_seq_len={} must be 0 (none) or a positive multiple of seq_len={}",
            max_target_seq_len, seq_len);
  const int64_t block = max_target_seq_len == 0 ? seq_len : max_target_seq_len;
  MOE_CHECK(vocab_size >= 1 && vocab_size <= int64_t{std::numeric_limits<int32_t>::max()} + 1,
            "[data] vocab_size={} is outside [1, 2^31]", vocab_size);
  MOE_CHECK(!paths.empty(), "[data] no token files given");
  const std::string dtype = token_dtype_descr(declared_dtype);
  MOE_CHECK(declared_dtype.empty() || !dtype.empty(),
            "[data] unsupported token dtype '{}' (expected uint16, uint32, int32 or int64)",
            declared_dtype);

  TokenDataset ds;
  ds.seq_len_ = seq_len;
  ds.instances_per_chunk_ = block / seq_len;
  ds.vocab_size_ = vocab_size;
  std::string eos_source;
  TokenMetaCache metas;
  const std::vector<std::string> token_files = expand_paths(paths);
  const std::vector<std::string> mask_files =
      label_mask_paths.empty() ? std::vector<std::string>()
                               : expand_paths(label_mask_paths, "label mask files");
  MOE_CHECK(mask_files.empty() || mask_files.size() == token_files.size(),
            "[data] {} label mask file(s) ({}) for {} token file(s) ({}): one per token file, in "
            "the same order",
            mask_files.size(), fmt::join(label_mask_paths, ", "), token_files.size(),
            fmt::join(paths, ", "));
  ds.has_label_masks_ = !mask_files.empty();
  for (const std::string& path : token_files) {
    const std::optional<TokenFileMeta> meta = metas.find(path);
    if (meta && meta->eos_id >= 0) {
      MOE_CHECK(ds.metadata_eos_id_ < 0 || ds.metadata_eos_id_ == meta->eos_id,
                "[data] token files disagree on EOS: {} says eos_id={}, {} says eos_id={}",
                eos_source, ds.metadata_eos_id_, meta->meta_path, meta->eos_id);
      ds.metadata_eos_id_ = meta->eos_id;
      eos_source = meta->meta_path;
    }
    File file = open_file(path, dtype, meta);
    if (ds.has_label_masks_) open_label_mask(file, mask_files[ds.files_.size()]);
    file.first_instance = ds.num_instances_;
    ds.num_instances_ += file.num_tokens / block * ds.instances_per_chunk_;
    ds.total_tokens_ += file.num_tokens;
    ds.files_.push_back(std::move(file));
  }
  MOE_CHECK(ds.num_instances_ > 0,
            "[data] {}: {} tokens in {} file(s) give no instance of seq_len={} (a file shorter "
            "than {} contributes nothing)",
            fmt::join(paths, ", "), ds.total_tokens_, ds.files_.size(), seq_len,
            block == seq_len ? "seq_len" : fmt::format("max_target_seq_len={}", block));
  return ds;
}

const TokenDataset::File& TokenDataset::file_of(int64_t index) const {
  MOE_CHECK(index >= 0 && index < num_instances_, "[data] instance {} out of range [0, {})", index,
            num_instances_);
  // The last file whose first instance is <= index; files without instances share their
  // successor's first_instance and so are never the last such file for a valid index.
  const auto it = std::upper_bound(files_.begin(), files_.end(), index,
                                   [](int64_t i, const File& f) { return i < f.first_instance; });
  return *(it - 1);
}

void TokenDataset::read_instance(int64_t index, int32_t* tokens) const {
  const File& file = file_of(index);
  read_tokens(static_cast<size_t>(&file - files_.data()), (index - file.first_instance) * seq_len_,
              seq_len_, tokens);
}

void TokenDataset::read_tokens(size_t file_index, int64_t start, int64_t count,
                               int32_t* tokens) const {
  MOE_CHECK(file_index < files_.size(), "[data] file {} out of range [0, {})", file_index,
            files_.size());
  const File& file = files_[file_index];
  MOE_CHECK(start >= 0 && count >= 0 && start + count <= file.num_tokens,
            "[data] {}: tokens [{}, {}) out of range [0, {})", file.path, start, start + count,
            file.num_tokens);
  const std::byte* p = file.data + static_cast<size_t>(start) * file.itemsize;
  for (int64_t t = 0; t < count; ++t, p += file.itemsize) {
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
              "[data] {}: token id {} at position {} is outside the vocabulary [0, {}){}",
              file.path, id, start + t, vocab_size_,
              file.npy ? std::string()
                       : fmt::format(" (read as {}: if that is not the headerless file's element "
                                     "type, declare it with data.dtype or --dtype)",
                                     token_dtype_name(file.dtype)));
    tokens[t] = static_cast<int32_t>(id);
  }
}

void TokenDataset::read_label_mask(size_t file_index, int64_t start, int64_t count,
                                   uint8_t* mask) const {
  MOE_CHECK(has_label_masks_, "[data] no label masks were given");
  MOE_CHECK(file_index < files_.size(), "[data] file {} out of range [0, {})", file_index,
            files_.size());
  const File& file = files_[file_index];
  MOE_CHECK(start >= 0 && count >= 0 && start + count <= file.num_tokens,
            "[data] {}: mask values [{}, {}) out of range [0, {})", file.mask_path, start,
            start + count, file.num_tokens);
  std::copy(file.mask + start, file.mask + start + count, mask);
}

void TokenDataset::read_example(int64_t index, int32_t* tokens, int32_t* targets) const {
  read_instance(index, tokens);
  std::copy(tokens + 1, tokens + seq_len_, targets);
  targets[seq_len_ - 1] = kIgnoreIndex;  // No next token inside the instance.
  if (!has_label_masks_) return;
  const File& file = file_of(index);
  const int64_t start = (index - file.first_instance) * seq_len_;
  for (int64_t t = 1; t < seq_len_; ++t)
    if (file.mask[start + t] == 0) targets[t - 1] = kIgnoreIndex;  // 0 / 1, checked at open
}

// ---- DataLoader ------------------------------------------------------------------------------

DataLoader::DataLoader(const TokenDataset& dataset, InstanceOrder order, uint64_t cursor,
                       int64_t dp_ranks)
    : dataset_(&dataset), order_(std::move(order)), cursor_(cursor), dp_ranks_(dp_ranks) {
  MOE_CHECK(order_.num_instances() == dataset.num_instances(),
            "[data] an order of {} instances cannot visit a dataset of {}", order_.num_instances(),
            dataset.num_instances());
  MOE_CHECK(dp_ranks >= 1, "[data] data-parallel ranks must be positive, got {}", dp_ranks);
}

std::span<const int64_t> DataLoader::next_batch(int64_t batch, std::vector<int32_t>& tokens,
                                                std::vector<int32_t>& targets) {
  MOE_CHECK(batch >= 1, "[data] batch size must be positive, got {}", batch);
  MOE_CHECK(batch % dp_ranks_ == 0, "[data] a batch of {} rows does not split over {} ranks", batch,
            dp_ranks_);
  const int64_t per_rank = batch / dp_ranks_;
  const bool round_robin = order_.rule() == OrderRule::kOlmoCore;
  rows_.resize(static_cast<size_t>(batch));
  for (int64_t rank = 0; rank < dp_ranks_; ++rank)
    for (int64_t j = 0; j < per_rank; ++j) {
      const int64_t position = round_robin ? rank + dp_ranks_ * j : rank * per_rank + j;
      rows_[static_cast<size_t>(rank * per_rank + j)] =
          order_.instance_at(cursor_ + static_cast<uint64_t>(position));
    }
  const int64_t T = dataset_->seq_len();
  tokens.resize(static_cast<size_t>(batch * T));
  targets.resize(static_cast<size_t>(batch * T));
  for (int64_t b = 0; b < batch; ++b)
    dataset_->read_example(rows_[static_cast<size_t>(b)], tokens.data() + b * T,
                           targets.data() + b * T);
  if (filter_) {
    // As OLMo-core's get_labels masks an instance: all of its labels.
    masked_.assign(static_cast<size_t>(batch), 0);
    for (int64_t b = 0; b < batch; ++b)
      if (!keeps_instance({tokens.data() + b * T, static_cast<size_t>(T)}, *filter_)) {
        masked_[static_cast<size_t>(b)] = 1;
        std::fill_n(targets.data() + b * T, T, kIgnoreIndex);
      }
  }
  // Only a complete batch moves the cursor, so a failed read can be retried or reported without
  // skipping data.
  cursor_ += static_cast<uint64_t>(batch);
  return rows_;
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
