#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/npy.h"
#include "data/prepare_corpus.h"
#include "data/token_dataset.h"
#include "io/file_util.h"
#include "scratch_dir.h"

namespace moecore::data {
namespace {

namespace fs = std::filesystem;

// Stand-in tokenizer: one token per byte, id = byte + offset (ids below offset are free for EOS).
EncodeFn byte_encoder(int32_t offset) {
  return [offset](std::string_view text) {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<int32_t>(static_cast<uint8_t>(c)) + offset);
    return ids;
  };
}

constexpr int32_t kEos = 1;
constexpr int32_t kOffset = 3;
constexpr int64_t kVocab = 256 + kOffset;

std::vector<int64_t> ids(const std::string& text, bool eos = true) {
  std::vector<int64_t> out;
  for (const char c : text) out.push_back(static_cast<uint8_t>(c) + kOffset);
  if (eos) out.push_back(kEos);
  return out;
}

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

class PrepareCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Blank and whitespace-only lines are no documents; CRLF and a missing final newline are fine.
    first_ = write("first.txt", "ab\n\ncd\r\n  \t\nxyz");
    second_ = write("second.txt", "q\n");
  }
  void TearDown() override { io::set_write_failure_for_testing(-1); }

  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::string out() const { return (dir_ / "out").string(); }

  // A part as OLMo-core reads it: the bare little-endian elements of `dtype` ("<u2" or "<u4"),
  // nothing else in the file.
  static std::vector<int64_t> read_array(const std::string& path, const std::string& dtype) {
    const std::string bytes = slurp(path);
    const size_t item = dtype == "<u2" ? 2 : 4;
    EXPECT_EQ(bytes.size() % item, 0u) << path;
    EXPECT_NE(bytes.rfind("\x93NUMPY", 0), 0u) << path << " has a NumPy header";
    std::vector<int64_t> values;
    for (size_t i = 0; i + item <= bytes.size(); i += item) {
      uint32_t v = 0;
      std::memcpy(&v, bytes.data() + i, item);  // little-endian host
      values.push_back(v);
    }
    return values;
  }

  static std::string slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Everything in dir_ except the inputs: temporaries must never be left behind.
  std::vector<std::string> outputs() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.find(".txt") == std::string::npos) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  ScratchDir scratch_{"moecore_prepare"};
  const fs::path dir_ = scratch_.path();
  std::string first_, second_;
};

TEST_F(PrepareCorpusTest, JoinsDocumentsWithEosAndSplitsTheLastDocumentsOff) {
  PrepareOptions options;
  options.tokenizer_path = "tok.json";
  const PrepareStats stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.25, options);
  EXPECT_EQ(stats.dtype, "uint16");
  EXPECT_EQ(stats.train_documents, 3);
  EXPECT_EQ(stats.val_documents, 1);  // floor(4 * 0.25).
  EXPECT_EQ(stats.train_tokens, 10);
  EXPECT_EQ(stats.val_tokens, 2);
  ASSERT_EQ(stats.train_files, std::vector<std::string>{out() + "/train/part-00000.npy"});
  ASSERT_EQ(stats.val_files, std::vector<std::string>{out() + "/val/part-00000.npy"});
  EXPECT_EQ(read_array(stats.train_files[0], "<u2"), concat({ids("ab"), ids("cd"), ids("xyz")}));
  EXPECT_EQ(read_array(stats.val_files[0], "<u2"), ids("q"));

  const nlohmann::json meta = nlohmann::json::parse(slurp(dir_ / "out" / "meta.json"));
  EXPECT_EQ(meta["vocab_size"], kVocab);
  EXPECT_EQ(meta["eos_id"], kEos);
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["header"], "none");
  EXPECT_EQ(meta["format_version"], 2);
  EXPECT_EQ(meta["tokenizer"], "tok.json");
  EXPECT_EQ(meta["input_files"], (std::vector<std::string>{first_, second_}));
  EXPECT_EQ(meta["train"]["tokens"], 10);
  EXPECT_EQ(meta["train"]["documents"], 3);
  EXPECT_EQ(meta["train"]["files"], std::vector<std::string>{"train/part-00000.npy"});
  EXPECT_EQ(meta["val"]["tokens"], 2);
  EXPECT_EQ(meta["val"]["documents"], 1);
  EXPECT_EQ(outputs(), std::vector<std::string>{"out"});

  // The loader reads what prepare wrote.
  const TokenDataset ds = TokenDataset::open({out() + "/train"}, 3, kVocab);
  EXPECT_EQ(ds.num_instances(), 3);  // 10 tokens: the 10th is dropped.
  std::vector<int32_t> tokens(3);
  ds.read_instance(1, tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'c' + kOffset, 'd' + kOffset, kEos}));
}

TEST_F(PrepareCorpusTest, ValidationSplitSizes) {
  // Any positive fraction gives at least one validation document; zero gives none.
  PrepareStats stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.01);
  EXPECT_EQ(stats.val_documents, 1);
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite);
  EXPECT_EQ(stats.val_documents, 0);
  EXPECT_EQ(stats.train_tokens, 12);
  EXPECT_TRUE(stats.val_files.empty());
  EXPECT_TRUE(fs::is_empty(dir_ / "out" / "val"));
  // One document cannot be split.
  const std::string one = write("one.txt", "only\n");
  EXPECT_NE(error_of([&] {
              prepare_corpus({one}, byte_encoder(kOffset), kEos, kVocab, out(), 0.5, overwrite);
            }).find("cannot give both"),
            std::string::npos);
}

TEST_F(PrepareCorpusTest, SplitsLargeSplitsIntoParts) {
  PrepareOptions options;
  options.max_tokens_per_part = 4;
  const PrepareStats stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.25, options);
  ASSERT_EQ(stats.train_files.size(), 3u);
  const std::vector<int64_t> all = concat({ids("ab"), ids("cd"), ids("xyz")});
  std::vector<int64_t> joined;
  for (const std::string& f : stats.train_files) {
    const std::vector<int64_t> part = read_array(f, "<u2");
    EXPECT_LE(part.size(), 4u);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, all);
  EXPECT_EQ(fs::path(stats.train_files[2]).filename(), "part-00002.npy");
}

TEST_F(PrepareCorpusTest, LargeVocabularyUsesUint32) {
  const int32_t offset = 65500;  // 'a' + offset > 65535.
  const PrepareStats stats =
      prepare_corpus({first_}, byte_encoder(offset), kEos, 70000, out(), 0.0);
  EXPECT_EQ(stats.dtype, "uint32");
  const std::vector<int64_t> values = read_array(stats.train_files[0], "<u4");
  ASSERT_EQ(values.size(), 10u);
  EXPECT_EQ(values[0], 'a' + offset);
  EXPECT_EQ(values[2], kEos);
  // Exactly 65536 still fits uint16.
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  EXPECT_EQ(prepare_corpus({first_}, byte_encoder(0), kEos, 65536, out(), 0.0, overwrite).dtype,
            "uint16");
}

TEST_F(PrepareCorpusTest, DtypeCanBeChosenAndTheReaderTakesItFromMetaJson) {
  PrepareOptions options;
  options.dtype = "uint32";
  const PrepareStats stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.25, options);
  EXPECT_EQ(stats.dtype, "uint32");
  const std::vector<int64_t> all = concat({ids("ab"), ids("cd"), ids("xyz")});
  EXPECT_EQ(read_array(stats.train_files[0], "<u4"), all);
  // Undeclared: meta.json (one directory up from the parts) says uint32, so no guess from the
  // small vocabulary (which would read uint16: twice the tokens, zeros interleaved).
  const TokenDataset ds = TokenDataset::open({out() + "/train"}, 2, kVocab);
  EXPECT_EQ(ds.total_tokens(), 10);
  EXPECT_EQ(ds.file_dtype(0), "<u4");
  EXPECT_EQ(ds.metadata_eos_id(), kEos);
  // A single part named directly finds it too; a declaration that contradicts it is an error.
  EXPECT_EQ(TokenDataset::open({stats.train_files[0]}, 2, kVocab).total_tokens(), 10);
  EXPECT_NE(error_of([&] {
              TokenDataset::open({stats.train_files[0]}, 2, kVocab, "uint16");
            }).find("data.dtype=uint16 but"),
            std::string::npos);
  // Copied away from its meta.json, the same file is undecidable: an error, not a guess.
  fs::copy_file(stats.train_files[0], dir_ / "orphan.npy");
  const std::string message =
      error_of([&] { TokenDataset::open({(dir_ / "orphan.npy").string()}, 2, kVocab); });
  EXPECT_NE(message.find("orphan.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("data.dtype"), std::string::npos) << message;
  EXPECT_EQ(
      TokenDataset::open({(dir_ / "orphan.npy").string()}, 2, kVocab, "uint32").total_tokens(), 10);

  // uint16 cannot hold a larger vocabulary; unknown names are refused.
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  overwrite.dtype = "uint16";
  EXPECT_NE(error_of([&] {
              prepare_corpus({first_}, byte_encoder(0), kEos, 70000, out(), 0.0, overwrite);
            }).find("uint16 cannot hold"),
            std::string::npos);
  overwrite.dtype = "int8";
  EXPECT_NE(error_of([&] {
              prepare_corpus({first_}, byte_encoder(0), kEos, kVocab, out(), 0.0, overwrite);
            }).find("unsupported dtype 'int8'"),
            std::string::npos);
}

TEST_F(PrepareCorpusTest, NpyHeaderWritesNumpyFiles) {
  PrepareOptions options;
  options.npy_header = true;
  const PrepareStats stats =
      prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.25, options);
  const NpyFile npy = NpyFile::open(stats.train_files[0]);
  EXPECT_EQ(npy.dtype(), "<u2");
  std::vector<int64_t> values;
  npy.read_ints(values);
  EXPECT_EQ(values, concat({ids("ab"), ids("cd"), ids("xyz")}));
  const nlohmann::json meta = nlohmann::json::parse(slurp(dir_ / "out" / "meta.json"));
  EXPECT_EQ(meta["header"], "npy");
  // Same instances as the headerless corpus.
  const TokenDataset ds = TokenDataset::open({out() + "/train"}, 3, kVocab);
  EXPECT_EQ(ds.num_instances(), 3);
}

TEST_F(PrepareCorpusTest, NeverOverwritesWithoutPermissionAndNeverHalfOverwrites) {
  prepare_corpus({first_, second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.25);
  const fs::path train = dir_ / "out" / "train" / "part-00000.npy";
  const std::string before = slurp(train);

  const std::string message =
      error_of([&] { prepare_corpus({second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0); });
  EXPECT_NE(message.find("already exists"), std::string::npos) << message;
  EXPECT_EQ(slurp(train), before);

  // A failure part-way (an id outside the vocabulary) leaves the old corpus and no temporaries.
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  const std::string bad = write("bad.txt", "fine\n\u2014\n");  // E2 80 94: E2 + 3 >= 200
  const std::string oov = error_of(
      [&] { prepare_corpus({bad}, byte_encoder(kOffset), kEos, 200, out(), 0.0, overwrite); });
  EXPECT_NE(oov.find("bad.txt: document 2 encodes to id 229"), std::string::npos) << oov;
  EXPECT_EQ(slurp(train), before);
  EXPECT_EQ(outputs(), std::vector<std::string>{"out"});

  // So does a full disk.
  io::set_write_failure_for_testing(3);
  EXPECT_THROW(
      prepare_corpus({second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite), Error);
  io::set_write_failure_for_testing(-1);
  EXPECT_EQ(slurp(train), before);
  EXPECT_EQ(outputs(), std::vector<std::string>{"out"});

  // With overwrite the new corpus replaces the old one completely.
  const PrepareStats stats =
      prepare_corpus({second_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite);
  EXPECT_EQ(read_array(stats.train_files[0], "<u2"), ids("q"));
  EXPECT_TRUE(fs::is_empty(dir_ / "out" / "val"));
  EXPECT_EQ(outputs(), std::vector<std::string>{"out"});
}

TEST_F(PrepareCorpusTest, RefusesToReplaceAnUnrelatedDirectory) {
  fs::create_directory(dir_ / "out");
  write("out/thesis.tex", "precious");
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  const std::string message = error_of([&] {
    prepare_corpus({first_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite);
  });
  EXPECT_NE(message.find("not a prepared token directory"), std::string::npos) << message;
  EXPECT_EQ(slurp(dir_ / "out" / "thesis.tex"), "precious");
}

TEST_F(PrepareCorpusTest, OverwriteNeverDeletesAnInputKeptInTheDirectory) {
  // --overwrite replaces the directory as a whole: a corpus or tokenizer kept inside it would go
  // with it. Refused, both left in place (an input beside it, in a sibling named alike, is fine).
  prepare_corpus({first_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0);
  const std::string inside = write("out/corpus.txt", "kept\n");
  const std::string tokenizer = write("out/tokenizer.json", "{}");
  PrepareOptions overwrite;
  overwrite.overwrite = true;
  std::string message = error_of([&] {
    prepare_corpus({inside}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite);
  });
  EXPECT_NE(message.find("corpus.txt lies inside"), std::string::npos) << message;
  overwrite.tokenizer_path = tokenizer;
  message = error_of([&] {
    prepare_corpus({first_}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite);
  });
  EXPECT_NE(message.find("tokenizer.json lies inside"), std::string::npos) << message;
  EXPECT_EQ(slurp(inside), "kept\n");
  EXPECT_EQ(slurp(tokenizer), "{}");
  overwrite.tokenizer_path.clear();
  const std::string beside = write("outer.txt", "ok\n");
  EXPECT_NO_THROW(
      prepare_corpus({beside}, byte_encoder(kOffset), kEos, kVocab, out(), 0.0, overwrite));
}

TEST_F(PrepareCorpusTest, BadInputsGiveOneLineErrors) {
  const auto expect_error = [&](const std::function<void()>& fn, const std::string& needle) {
    const std::string message = error_of(fn);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };
  const EncodeFn enc = byte_encoder(kOffset);
  // Unwritable destination: its parent is a regular file.
  const std::string blocker = write("blocker", "");
  expect_error([&] { prepare_corpus({first_}, enc, kEos, kVocab, blocker + "/out", 0.0); },
               "cannot create");
  expect_error(
      [&] { prepare_corpus({(dir_ / "missing.txt").string()}, enc, kEos, kVocab, out(), 0.0); },
      "missing.txt: cannot open");
  const std::string blank = write("blank.txt", "\n \n");
  expect_error([&] { prepare_corpus({blank}, enc, kEos, kVocab, out(), 0.0); }, "no non-blank");
  expect_error([&] { prepare_corpus({first_}, enc, 300, kVocab, out(), 0.0); }, "eos_id=300");
  expect_error([&] { prepare_corpus({first_}, enc, kEos, kVocab, out(), 1.0); }, "val_fraction");
  // A directory is named as one, not reported as a read error ("Is a directory").
  expect_error([&] { prepare_corpus({dir_.string()}, enc, kEos, kVocab, out(), 0.0); },
               dir_.string() + ": is a directory");
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

// tokenizers encodes Python strings: a byte that is not UTF-8 is refused with the file and its
// offset (counted over every line, blank ones and line ends included), before anything is written.
TEST_F(PrepareCorpusTest, InputThatIsNotUtf8IsRefusedWithItsOffset) {
  const EncodeFn enc = byte_encoder(kOffset);
  const std::string bad = write("bad.txt", "ok line\n\n caf\xC3\xA9 \xC3( tail\n");
  const std::string message = error_of([&] {
    prepare_corpus({first_, bad}, enc, kEos, kVocab, out(), 0.0);
  });
  EXPECT_NE(message.find(bad + ": not UTF-8 at byte 16"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  // Truncated and overlong sequences and encoded surrogates are refused too.
  for (const std::string& text :
       {std::string("ab\xE2\x82"), std::string("ab\xC0\xAF"), std::string("ab\xED\xA0\x80")}) {
    const std::string path = write("bad2.txt", text);
    const std::string m = error_of([&] { prepare_corpus({path}, enc, kEos, kVocab, out(), 0.0); });
    EXPECT_NE(m.find("not UTF-8 at byte 2"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace moecore::data
