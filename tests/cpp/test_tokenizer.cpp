#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/bpe_trainer.h"
#include "data/tokenizer.h"
#include "data/tokenizer_byte_level.h"

namespace moecore::data {
namespace {

namespace fs = std::filesystem;

const char* kCorpus =
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "And the Spirit of God moved upon the face of the waters.\n"
    "And God said, Let there be light: and there was light.\n"
    "  It's 1611;   they're   here\t\ttoo.\n\n"
    "Naïve café — “quoted” ½ 中文 😀👍🏽\n";

const std::vector<std::string> kSpecials = {"<|endoftext|>", "<pad>"};

const Tokenizer& small_tokenizer() {
  static const Tokenizer t = train_bpe_from_texts({kCorpus, kCorpus}, 400, kSpecials);
  return t;
}

// The error message a callable throws (empty when it does not throw moecore::Error).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_one_line_error(const std::string& message, const std::string& needle) {
  EXPECT_FALSE(message.empty()) << "expected an error mentioning " << needle;
  EXPECT_EQ(message.rfind("[tokenizer]", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << message;
}

class TokenizerFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::path(::testing::TempDir()) / "moecore_tok_XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream out(path(name), std::ios::binary);
    out << text;
    return path(name);
  }
  fs::path dir_;
};

// --- byte-level helpers ------------------------------------------------------------------------

TEST(TokenizerByteLevel, Gpt2ByteMapping) {
  const auto& chars = byte_level_chars();
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars[' '], "Ġ");   // U+0120
  EXPECT_EQ(chars['\n'], "Ċ");  // U+010A
  EXPECT_EQ(chars[0], "Ā");     // U+0100
  EXPECT_EQ(chars[0xAD], "Ń");  // U+0143, the last remapped byte
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(byte_level_byte(byte_level_code_point(static_cast<uint8_t>(b))), b);
  }
}

TEST(TokenizerByteLevel, Gpt2RegexSplit) {
  const RegexSplitter splitter(kGpt2SplitPattern, "test");
  std::vector<std::string_view> pieces;
  splitter.split("Hello's  world 123!!\n\n x\u00a0y", pieces);
  const std::vector<std::string_view> expected = {"Hello", "'s",   " ",  " world", " 123",
                                                  "!!",    "\n\n", " x", "\u00a0", "y"};
  EXPECT_EQ(pieces, expected);
}

// --- round trips -------------------------------------------------------------------------------

TEST(Tokenizer, RoundTripAscii) {
  const Tokenizer& t = small_tokenizer();
  for (const std::string text :
       {"In the beginning", "Hello, World! 42 times; x=y+z.", "it's we're they've I'm"}) {
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  // Trained merges compress text they were trained on.
  EXPECT_LT(t.encode("And the earth was without form").size(), 30u / 2);
}

TEST(Tokenizer, RoundTripUtf8MultiByte) {
  const Tokenizer& t = small_tokenizer();
  for (const std::string text : {"naïve café", "中文字 日本語", "Ελληνικά κείμενα", "٣٤ ½ ①"}) {
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
}

TEST(Tokenizer, RoundTripEmoji) {
  const Tokenizer& t = small_tokenizer();
  const std::string text = "emoji 😀👍🏽 family 👨‍👩‍👧 🂡🂡";
  EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(Tokenizer, RoundTripWhitespaceRunsAndNewlines) {
  const Tokenizer& t = small_tokenizer();
  for (const std::string text : {"   leading", "trailing   ", "a \t\t b", "\n", "a\n\nb\r\nc",
                                 "   \n  \n ", "x\u0085y\u2028z"}) {
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  // A long run of spaces must neither overflow the regex engine nor take quadratic time.
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(t.decode(t.encode(spaces)), spaces);
  const std::string long_word(100000, 'a');
  EXPECT_EQ(t.decode(t.encode(long_word)), long_word);
}

TEST(Tokenizer, RoundTripEmptyAndInvalidUtf8) {
  const Tokenizer& t = small_tokenizer();
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.decode({}), "");
  const std::string bytes = std::string("ok \xff\xfe bad \xc3") + std::string(1, '\0') + "end";
  EXPECT_EQ(t.decode(t.encode(bytes)), bytes);
}

// --- special tokens ----------------------------------------------------------------------------

TEST(Tokenizer, SpecialTokens) {
  const Tokenizer& t = small_tokenizer();
  EXPECT_EQ(t.eos_id(), 0);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.token_id("<pad>"), 1);
  EXPECT_EQ(t.token_id("no such token"), std::nullopt);
  const std::vector<int32_t> ids =
      t.encode("<|endoftext|>the<pad> earth<|endoftext|><|endoftext|>");
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids[ids.size() - 1], 0);
  EXPECT_EQ(ids[ids.size() - 2], 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  EXPECT_EQ(t.decode(ids), "<|endoftext|>the<pad> earth<|endoftext|><|endoftext|>");
  // A special token is matched only whole; fragments are ordinary text.
  const std::vector<int32_t> partial = t.encode("<|endoftext");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), 0), 0);
  EXPECT_EQ(t.decode(partial), "<|endoftext");
}

TEST(Tokenizer, NoEosIsAnError) {
  const Tokenizer t = train_bpe_from_texts({"abc abc"}, 260, {});
  expect_one_line_error(error_of([&] { (void)t.eos_id(); }), "no EOS token");
}

// --- hand-written tokenizer.json ---------------------------------------------------------------

std::string tiny_json(bool legacy_merges) {
  nlohmann::json vocab = {{"h", 0},
                          {"e", 1},
                          {"l", 2},
                          {"o", 3},
                          {"Ġ", 4},
                          {"'", 5},
                          {"s", 6},
                          {"he", 7},
                          {"ll", 8},
                          {"hell", 9},
                          {"hello", 10},
                          {"Ġhello", 11},
                          {"<|endoftext|>", 12}};
  // A byte-level vocabulary holds every byte's symbol: the ones not listed above follow from 13.
  int64_t next_id = 13;
  for (const std::string& symbol : byte_level_chars())
    if (!vocab.contains(symbol)) vocab[symbol] = next_id++;
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "hello"}};
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    if (legacy_merges) {
      m.push_back(a + " " + b);
    } else {
      m.push_back({a, b});
    }
  }
  nlohmann::json doc = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 12}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  return doc.dump();
}

TEST(Tokenizer, LoadsBothMergeFormats) {
  for (bool legacy : {false, true}) {
    const Tokenizer t = Tokenizer::from_json(tiny_json(legacy));
    EXPECT_EQ(t.vocab_size(), 13 + 256 - 7);
    EXPECT_EQ(t.eos_id(), 12);
    EXPECT_EQ(t.encode("hello hello's<|endoftext|>"), (std::vector<int32_t>{10, 11, 5, 6, 12}));
    EXPECT_EQ(t.encode("hex"), (std::vector<int32_t>{7, *t.token_id("x")}));
    EXPECT_EQ(t.decode({11, 5, 6}), " hello's");
    EXPECT_EQ(t.id_to_token(11), "Ġhello");
  }
}

TEST_F(TokenizerFileTest, SaveAndLoadRoundTrip) {
  const Tokenizer& t = small_tokenizer();
  t.save(path("tokenizer.json"));
  const Tokenizer loaded = Tokenizer::load(path("tokenizer.json"));
  EXPECT_EQ(loaded.vocab_size(), t.vocab_size());
  EXPECT_EQ(loaded.encode(kCorpus), t.encode(kCorpus));
  EXPECT_EQ(loaded.to_json(), t.to_json());
  const auto doc = nlohmann::json::parse(loaded.to_json());
  EXPECT_EQ(doc["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(doc["decoder"]["type"], "ByteLevel");
  EXPECT_TRUE(doc["model"]["dropout"].is_null());
  EXPECT_EQ(doc["model"]["ignore_merges"], false);
}

// --- training ----------------------------------------------------------------------------------

TEST(BpeTrainer, DeterministicVocab) {
  const Tokenizer a = train_bpe_from_texts({kCorpus}, 350, kSpecials);
  const Tokenizer b = train_bpe_from_texts({kCorpus}, 350, kSpecials);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.vocab_size(), 350);
  // Special tokens first, then the bytes ordered by their byte-level code point.
  EXPECT_EQ(a.id_to_token(0), "<|endoftext|>");
  EXPECT_EQ(a.id_to_token(1), "<pad>");
  EXPECT_EQ(a.id_to_token(2), "!");
  EXPECT_EQ(a.id_to_token(2 + 94), "¡");
  EXPECT_EQ(a.id_to_token(2 + 188), "Ā");
  EXPECT_EQ(a.id_to_token(2 + 255), "Ń");
  // The most frequent pair of the corpus is merged first.
  const auto doc = nlohmann::json::parse(a.to_json());
  EXPECT_EQ(doc["model"]["merges"][0], (nlohmann::json{"t", "h"}));
}

TEST(BpeTrainer, TiesGoToTheSmallestIdPair) {
  // Every pair occurs once: (a,b) < (c,d) < (Ġ,c) by id ('a' < 'c' < 'Ġ' as code points).
  const Tokenizer t = train_bpe_from_texts({"ab cd"}, 256 + 3, {});
  const auto merges = nlohmann::json::parse(t.to_json())["model"]["merges"];
  ASSERT_EQ(merges.size(), 3u);
  EXPECT_EQ(merges[0], (nlohmann::json{"a", "b"}));
  EXPECT_EQ(merges[1], (nlohmann::json{"c", "d"}));
  EXPECT_EQ(merges[2], (nlohmann::json{"Ġ", "cd"}));
  EXPECT_EQ(t.encode("ab cd"), (std::vector<int32_t>{256, 258}));
}

TEST(BpeTrainer, StopsWhenNoPairsAreLeft) {
  const Tokenizer t = train_bpe_from_texts({"aaaa"}, 1000, {"<|endoftext|>"});
  EXPECT_EQ(t.vocab_size(), 1 + 256 + 2);  // aa, aaaa
  EXPECT_EQ(t.encode("aaaa").size(), 1u);
}

TEST_F(TokenizerFileTest, TrainFromFiles) {
  const std::string f1 = write("a.txt", kCorpus);
  const std::string f2 = write("b.txt", "more text\nand more\n");
  const Tokenizer from_files = train_bpe({f1, f2}, 300, {"<|endoftext|>"});
  const Tokenizer from_texts =
      train_bpe_from_texts({kCorpus, "more text\nand more\n"}, 300, {"<|endoftext|>"});
  EXPECT_EQ(from_files.to_json(), from_texts.to_json());
  expect_one_line_error(error_of([&] { train_bpe({path("missing.txt")}, 300, {}); }),
                        "missing.txt");
}

TEST(BpeTrainer, RejectsTooSmallVocab) {
  expect_one_line_error(error_of([] { train_bpe_from_texts({"abc"}, 200, {"<|endoftext|>"}); }),
                        "vocab_size=200");
}

// --- malformed input ---------------------------------------------------------------------------

TEST_F(TokenizerFileTest, MalformedJsonIsAOneLineError) {
  const std::string broken = write("broken.json", "{\n  \"model\": {\n   oops\n");
  expect_one_line_error(error_of([&] { Tokenizer::load(broken); }), "broken.json");
  expect_one_line_error(error_of([&] { Tokenizer::load(broken); }), "invalid JSON");
  expect_one_line_error(error_of([&] { Tokenizer::load(path("absent.json")); }), "absent.json");

  auto doc = nlohmann::json::parse(tiny_json(false));
  auto with = [&](auto edit) {
    nlohmann::json d = doc;
    edit(d);
    return write("edited.json", d.dump());
  };
  expect_one_line_error(error_of([&] { Tokenizer::load(with([](auto& d) { d.erase("model"); })); }),
                        "model");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["model"]["type"] = "WordPiece"; })); }),
      "WordPiece");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["model"]["merges"][1] = "l zz"; })); }),
      "zz");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["model"]["merges"][0] = 7; })); }),
      "merge 0");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["model"]["vocab"]["h"] = "x"; })); }),
      "non-integer id");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["pre_tokenizer"] = nullptr; })); }),
      "pre_tokenizer");
  expect_one_line_error(
      error_of([&] { Tokenizer::load(with([](auto& d) { d["added_tokens"][0]["id"] = "x"; })); }),
      "added token");
  expect_one_line_error(error_of([&] { Tokenizer::from_json("[1, 2]", "list.json"); }),
                        "list.json");
}

// Issue 13: ids dense and unique, every byte symbol present, sizes checked before allocation,
// wrong types named with their key.
TEST(Tokenizer, RejectsSparseDuplicateAndHugeIds) {
  const nlohmann::json doc = nlohmann::json::parse(tiny_json(false));
  auto load = [&](auto edit) {
    nlohmann::json d = doc;
    edit(d);
    return error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); });
  };
  // One huge id: refused from the entry count, before anything is sized by it.
  expect_one_line_error(load([](auto& d) { d["model"]["vocab"]["hello"] = 100000063; }),
                        "id 100000063 with only");
  // A hole: the largest id is in range but one id is nobody's.
  expect_one_line_error(load([](auto& d) {
                          d["model"]["vocab"]["Ġhello"] = 7;  // 11 becomes free, 7 doubled
                        }),
                        "id 7 names both");
  expect_one_line_error(load([](auto& d) {
                          d["model"]["vocab"]["hello"] = 12;  // 10 free; 12 = <|endoftext|>
                          d["model"]["vocab"].erase("<|endoftext|>");
                          d["added_tokens"][0]["id"] = 10;
                          d["added_tokens"].push_back({{"id", 10}, {"content", "<x>"}});
                        }),
                        "share id 10");
  expect_one_line_error(load([](auto& d) { d["added_tokens"][0]["id"] = 11; }),
                        "which the vocab gives to");
  expect_one_line_error(load([](auto& d) { d["model"]["vocab"].erase("'"); }), "no token has id 5");
  expect_one_line_error(load([](auto& d) {
                          d["model"]["vocab"] = nlohmann::json::object();
                          d["model"]["merges"] = nlohmann::json::array();
                          d["added_tokens"] = nlohmann::json::array();
                        }),
                        "no symbol");
}

TEST(Tokenizer, ByteLevelVocabularyHoldsAll256Bytes) {
  nlohmann::json d = nlohmann::json::parse(tiny_json(false));
  // Drop the symbol of "\n" (Ċ) and give its id to a new token, so that ids stay dense.
  const std::string newline_symbol = byte_level_chars()[static_cast<size_t>('\n')];
  const int64_t id = d["model"]["vocab"][newline_symbol].get<int64_t>();
  d["model"]["vocab"].erase(newline_symbol);
  d["model"]["vocab"]["zz"] = id;
  const std::string error = error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); });
  expect_one_line_error(error, "byte 0x0A");
}

TEST(Tokenizer, WrongFieldTypesNameTheKey) {
  nlohmann::json d = nlohmann::json::parse(tiny_json(false));
  d["model"]["fuse_unk"] = "yes";
  const std::string error = error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); });
  expect_one_line_error(error, "'fuse_unk' must be true or false, not \"yes\"");
  EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  d = nlohmann::json::parse(tiny_json(false));
  d["model"]["dropout"] = "0.1";
  expect_one_line_error(error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); }), "dropout");
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  const Tokenizer& t = small_tokenizer();
  expect_one_line_error(error_of([&] { (void)t.decode({5, 400}); }), "id 400");
  expect_one_line_error(error_of([&] { (void)t.decode({-1}); }), "id -1");
}

}  // namespace
}  // namespace moecore::data
