#include "data/prepare_corpus.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <system_error>
#include <vector>

#include "core/check.h"
#include "data/npy.h"
#include "data/tokenizer_byte_level.h"
#include "io/file_util.h"

namespace moecore::data {

namespace {

namespace fs = std::filesystem;

using io::errno_text;

// A line carries a document unless it is empty or only whitespace (blank lines separate
// paragraphs in many corpora; an "empty document" would only add a stray EOS).
bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

// Calls fn(line) for every non-blank line of `path`, without its line terminator ("\n" or
// "\r\n"). POSIX getline handles lines of any length and reports read errors through errno. The
// text must be UTF-8, as tokenizers (which takes Python strings) requires: an invalid byte is an
// error naming its offset, never tokenized as it stands.
template <typename Fn>
void for_each_document(const std::string& path, Fn&& fn) {
  std::error_code ec;
  MOE_CHECK(!fs::is_directory(path, ec), "[prepare] {}: is a directory, not a text file", path);
  std::FILE* file = std::fopen(path.c_str(), "rb");
  MOE_CHECK(file != nullptr, "[prepare] {}: cannot open: {}", path, errno_text(errno));
  char* buffer = nullptr;
  size_t capacity = 0;
  size_t line_offset = 0;  // of the line in the file
  try {
    while (true) {
      errno = 0;
      const ssize_t n = ::getline(&buffer, &capacity, file);
      if (n < 0) {
        MOE_CHECK(!std::ferror(file), "[prepare] {}: read error: {}", path, errno_text(errno));
        break;
      }
      std::string_view line(buffer, static_cast<size_t>(n));
      const size_t invalid = utf8_invalid_offset(line);
      MOE_CHECK(invalid == std::string_view::npos,
                "[prepare] {}: not UTF-8 at byte {} (the input must be UTF-8 text)", path,
                line_offset + invalid);
      line_offset += line.size();
      if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!is_blank(line)) fn(line);
    }
  } catch (...) {
    std::free(buffer);
    std::fclose(file);
    throw;
  }
  std::free(buffer);
  std::fclose(file);
}

// Accumulates one split's tokens and writes them as part-00000.npy, part-00001.npy, ... each
// holding at most max_tokens tokens; a document may continue in the next part, as in OLMo-core.
class PartWriter {
 public:
  // dtype: "<u2" or "<u4".
  PartWriter(fs::path dir, std::string dtype, int64_t max_tokens, bool npy_header)
      : dir_(std::move(dir)),
        dtype_(std::move(dtype)),
        max_tokens_(max_tokens),
        npy_header_(npy_header) {}

  void push(uint32_t id) {
    if (dtype_ == "<u2") {
      u16_.push_back(static_cast<uint16_t>(id));
    } else {
      u32_.push_back(id);
    }
    ++tokens_;
    if (buffered() == max_tokens_) flush();
  }

  void flush() {
    if (buffered() == 0) return;
    const fs::path path = dir_ / fmt::format("part-{:05d}.npy", files_.size());
    const void* data = dtype_ == "<u2" ? static_cast<const void*>(u16_.data()) : u32_.data();
    if (npy_header_) {
      write_npy(path.string(), dtype_, {buffered()}, data);
    } else {
      // The bare elements, as np.memmap(mode="w+") writes them (little-endian host).
      const size_t bytes = static_cast<size_t>(buffered()) * (dtype_ == "<u2" ? 2 : 4);
      const std::span<const std::byte> chunks[] = {{static_cast<const std::byte*>(data), bytes}};
      io::write_file_atomic(path.string(), chunks, "[prepare]");
    }
    files_.push_back(path.filename().string());
    u16_.clear();
    u32_.clear();
  }

  int64_t tokens() const { return tokens_; }
  const std::vector<std::string>& files() const { return files_; }  // Names within dir.

 private:
  int64_t buffered() const { return static_cast<int64_t>(u16_.size() + u32_.size()); }

  fs::path dir_;
  std::string dtype_;
  int64_t max_tokens_;
  bool npy_header_;
  std::vector<uint16_t> u16_;
  std::vector<uint32_t> u32_;
  int64_t tokens_ = 0;
  std::vector<std::string> files_;
};

// Removes the temporary build directory unless the build succeeded and it was renamed into place.
class TempDirGuard {
 public:
  explicit TempDirGuard(fs::path path) : path_(std::move(path)) {}
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;
  ~TempDirGuard() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);  // Best effort: nothing useful to do about a failure here.
    }
  }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "[prepare] cannot open directory '{}' to fsync: {}", dir.string(),
            errno_text(errno));
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL;  // Some filesystems cannot.
  const int err = errno;
  ::close(fd);
  MOE_CHECK(synced, "[prepare] fsync of directory '{}' failed: {}", dir.string(), errno_text(err));
}

// Moves the finished `tmp` to `target`. Without `replace`, fails if target has appeared meanwhile.
// With it, Linux's renameat2(RENAME_EXCHANGE) swaps the two directories in one step, so a crash
// leaves either the old or the new corpus at target; the old one then sits at tmp and is deleted.
// Filesystems without renameat2 get a move-aside-then-rename fallback.
void move_into_place(const fs::path& tmp, const fs::path& target, bool replace) {
#if defined(RENAME_NOREPLACE) && defined(RENAME_EXCHANGE)
  const unsigned flags = replace ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), flags) == 0) return;
  const int err = errno;
  MOE_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP,
            "[prepare] cannot move '{}' to '{}': {}", tmp.string(), target.string(),
            errno_text(err));
#endif
  if (!replace) {
    MOE_CHECK(::rename(tmp.c_str(), target.c_str()) == 0, "[prepare] cannot move '{}' to '{}': {}",
              tmp.string(), target.string(), errno_text(errno));
    return;
  }
  const fs::path aside = tmp.string() + ".old";
  MOE_CHECK(::rename(target.c_str(), aside.c_str()) == 0, "[prepare] cannot move '{}' aside: {}",
            target.string(), errno_text(errno));
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int rename_err = errno;
    ::rename(aside.c_str(), target.c_str());  // Put the old corpus back.
    fail("[prepare] cannot move '{}' to '{}': {}", tmp.string(), target.string(),
         errno_text(rename_err));
  }
  ::rename(aside.c_str(), tmp.c_str());  // The caller deletes tmp, which now holds the old data.
}

}  // namespace

PrepareStats prepare_corpus(const std::vector<std::string>& input_files, const EncodeFn& encode,
                            int32_t eos_id, int64_t vocab_size, const std::string& out_dir,
                            double val_fraction, const PrepareOptions& options) {
  // TokenDataset hands ids to the model as int32, hence the 2^31 bound.
  MOE_CHECK(vocab_size >= 1 && vocab_size <= int64_t{std::numeric_limits<int32_t>::max()} + 1,
            "[prepare] vocab_size={} is outside [1, 2^31]", vocab_size);
  MOE_CHECK(eos_id >= 0 && eos_id < vocab_size, "[prepare] eos_id={} is outside [0, {})", eos_id,
            vocab_size);
  MOE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0,
            "[prepare] val_fraction={} is outside [0, 1)", val_fraction);
  MOE_CHECK(options.max_tokens_per_part >= 1, "[prepare] max_tokens_per_part={} must be positive",
            options.max_tokens_per_part);
  MOE_CHECK(!input_files.empty(), "[prepare] no input files given");
  MOE_CHECK(options.dtype.empty() || options.dtype == "uint16" || options.dtype == "uint32",
            "[prepare] unsupported dtype '{}' (expected uint16 or uint32)", options.dtype);
  const std::string dtype_name = !options.dtype.empty() ? options.dtype
                                 : vocab_size <= 65536  ? "uint16"
                                                        : "uint32";
  MOE_CHECK(dtype_name == "uint32" || vocab_size <= 65536,
            "[prepare] dtype uint16 cannot hold the ids of a {}-token vocabulary (use uint32)",
            vocab_size);
  MOE_CHECK(static_cast<bool>(encode), "[prepare] no tokenizer (encode function) given");

  // "data/kjv/" and "data/kjv" name the same directory; the temporary must be its sibling.
  std::string target_text = out_dir;
  while (target_text.size() > 1 && target_text.back() == '/') target_text.pop_back();
  MOE_CHECK(!target_text.empty(), "[prepare] empty output directory");
  const fs::path target(target_text);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");

  std::error_code ec;
  const fs::file_status status = fs::symlink_status(target, ec);
  const bool exists = fs::exists(status);
  if (exists) {
    MOE_CHECK(options.overwrite,
              "[prepare] {} already exists; refusing to overwrite it (use --overwrite to replace "
              "it)",
              target.string());
    MOE_CHECK(fs::is_directory(status) &&
                  (fs::is_empty(target, ec) || fs::exists(target / "meta.json", ec)),
              "[prepare] {} exists and is not a prepared token directory (no meta.json); "
              "refusing to replace it",
              target.string());
    // --overwrite replaces the whole directory: an input kept in it would be deleted with it.
    // Where a path cannot be resolved (a permission), its absolute spelling stands in.
    const auto resolved = [](const fs::path& path) {
      std::error_code resolve_error;
      const fs::path canonical = fs::weakly_canonical(path, resolve_error);
      return resolve_error ? fs::absolute(path).lexically_normal() : canonical;
    };
    const fs::path replaced = resolved(target);
    std::vector<std::string> inputs = input_files;
    if (!options.tokenizer_path.empty()) inputs.push_back(options.tokenizer_path);
    for (const std::string& input : inputs) {
      const fs::path where = resolved(input);
      const bool inside =
          std::mismatch(replaced.begin(), replaced.end(), where.begin(), where.end()).first ==
          replaced.end();
      MOE_CHECK(!inside,
                "[prepare] {} lies inside {}, which --overwrite replaces as a whole: move it out "
                "first",
                input, target.string());
    }
  }

  // Pass 1: count documents, so that the validation split (the last documents) is known before
  // any token is written.
  int64_t num_documents = 0;
  for (const std::string& path : input_files) {
    for_each_document(path, [&](std::string_view) { ++num_documents; });
  }
  MOE_CHECK(num_documents > 0, "[prepare] the input files hold no non-blank line (document)");
  int64_t val_documents = 0;
  if (val_fraction > 0.0) {
    val_documents = std::max<int64_t>(
        1, static_cast<int64_t>(std::floor(static_cast<double>(num_documents) * val_fraction)));
    MOE_CHECK(val_documents < num_documents,
              "[prepare] {} document(s) cannot give both a training and a validation split at "
              "val_fraction={}",
              num_documents, val_fraction);
  }
  const int64_t train_documents = num_documents - val_documents;

  fs::create_directories(parent, ec);
  MOE_CHECK(!ec, "[prepare] cannot create output directory '{}': {}", parent.string(),
            ec.message());
  const fs::path tmp = target.string() + fmt::format(".tmp.{}", ::getpid());
  fs::remove_all(tmp, ec);  // A leftover from a crashed run that had our pid.
  MOE_CHECK(fs::create_directory(tmp, ec) && !ec, "[prepare] cannot create '{}': {}", tmp.string(),
            ec ? ec.message() : "already exists");
  TempDirGuard guard(tmp);
  for (const char* split : {"train", "val"}) {
    fs::create_directory(tmp / split, ec);
    MOE_CHECK(!ec, "[prepare] cannot create '{}': {}", (tmp / split).string(), ec.message());
  }

  const std::string dtype = dtype_name == "uint16" ? "<u2" : "<u4";
  PartWriter train(tmp / "train", dtype, options.max_tokens_per_part, options.npy_header);
  PartWriter val(tmp / "val", dtype, options.max_tokens_per_part, options.npy_header);

  // Pass 2: tokenise and write.
  int64_t document = 0;
  for (const std::string& path : input_files) {
    int64_t line_document = 0;
    for_each_document(path, [&](std::string_view text) {
      ++line_document;
      MOE_CHECK(document < num_documents, "[prepare] {}: file changed while being prepared", path);
      PartWriter& split = document < train_documents ? train : val;
      for (const int32_t id : encode(text)) {
        MOE_CHECK(id >= 0 && id < vocab_size,
                  "[prepare] {}: document {} encodes to id {} outside the vocabulary [0, {})", path,
                  line_document, id, vocab_size);
        split.push(static_cast<uint32_t>(id));
      }
      split.push(static_cast<uint32_t>(eos_id));  // EOS after every document, as OLMo-core.
      ++document;
    });
  }
  MOE_CHECK(document == num_documents, "[prepare] input files changed while being prepared");
  train.flush();
  val.flush();

  nlohmann::json meta;
  meta["format"] = "moecore-tokens";
  // Version 2: headerless parts by default ("header"), dtype by NumPy name.
  meta["format_version"] = 2;
  meta["vocab_size"] = vocab_size;
  meta["eos_id"] = eos_id;
  meta["dtype"] = dtype_name;
  meta["header"] = options.npy_header ? "npy" : "none";
  meta["byte_order"] = "little";
  meta["document"] = "one non-blank input line, followed by eos_id";
  meta["tokenizer"] = options.tokenizer_path.empty() ? nlohmann::json(nullptr)
                                                     : nlohmann::json(options.tokenizer_path);
  meta["input_files"] = input_files;
  meta["val_fraction"] = val_fraction;
  meta["max_tokens_per_part"] = options.max_tokens_per_part;
  PrepareStats stats;
  stats.dtype = dtype_name;
  stats.train_documents = train_documents;
  stats.val_documents = val_documents;
  stats.train_tokens = train.tokens();
  stats.val_tokens = val.tokens();
  const auto describe = [&](const char* name, const PartWriter& writer, int64_t documents,
                            std::vector<std::string>& final_paths) {
    nlohmann::json files = nlohmann::json::array();
    for (const std::string& file : writer.files()) {
      files.push_back(fmt::format("{}/{}", name, file));  // Relative: the directory may move.
      final_paths.push_back((target / name / file).string());
    }
    meta[name] = {{"documents", documents}, {"tokens", writer.tokens()}, {"files", files}};
  };
  describe("train", train, train_documents, stats.train_files);
  describe("val", val, val_documents, stats.val_files);
  const std::string meta_text = meta.dump(2) + "\n";
  const std::span<const std::byte> chunks[] = {std::as_bytes(std::span(meta_text))};
  // Also fsyncs tmp, which makes the train/ and val/ entries durable.
  io::write_file_atomic((tmp / "meta.json").string(), chunks, "[prepare]");

  move_into_place(tmp, target, exists);
  if (!exists)
    guard.release();  // After an exchange, tmp holds the old corpus: the guard deletes it.
  fsync_directory(parent);
  return stats;
}

}  // namespace moecore::data
