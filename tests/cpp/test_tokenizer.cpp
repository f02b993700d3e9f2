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
#include "scratch_dir.h"

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
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream out(path(name), std::ios::binary);
    out << text;
    return path(name);
  }
  ScratchDir scratch_{"moecore_tok"};
  const fs::path dir_ = scratch_.path();
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

// Oniguruma (Ruby syntax), which tokenizers compiles Split regexes with: ^ and $ are line anchors
// at LF, \A \z \Z are not; \h is a hex digit, \v the vertical tab, \w the Unicode word class
// (marks included, No excluded), \uHHHH a code point, (?m) dot-matches-newline. Expected pieces
// are tokenizers 0.22.1's (pre_tokenizers.Split(Regex(p), "isolated").pre_tokenize_str).
TEST(TokenizerByteLevel, OnigurumaAnchorsAndEscapes) {
  struct Case {
    const char* pattern;
    std::string_view text;
    std::vector<std::string_view> pieces;
  };
  const std::vector<Case> cases = {
      {R"(\s+$)", "the  \nfox  \ndog", {"the", "  ", "\nfox", "  ", "\ndog"}},
      {R"(^h)", "the\nhello", {"the\n", "h", "ello"}},
      {R"(o\Z)", "foo\n", {"fo", "o", "\n"}},
      {R"(o\z)", "foo\n", {"foo\n"}},
      {R"(\Af)", "f\nf", {"f", "\nf"}},
      {R"(.+)", "a\rb\nc\u2028d\u0085e", {"a\rb", "\n", "c\u2028d\u0085e"}},
      {R"((?m)a.b)", "a\nb", {"a\nb"}},
      {R"(\h+)", "xyz09afAF g\t", {"xyz", "09afAF", " g\t"}},
      {R"([\H]+)", "ab xy", {"ab", " xy"}},
      {R"(\v)", "a\vb\nc", {"a", "\v", "b\nc"}},
      {R"(\u0041+)", "xAAy", {"x", "AA", "y"}},
      {R"(\w+)",
       "\u00e9_x\u2460a\u0301 \u200d \u2177",
       {"\u00e9_x", "\u2460", "a\u0301", " \u200d ", "\u2177"}},
      {R"(\bx)", "\u00e9x x \u2460x", {"\u00e9x ", "x", " \u2460", "x"}},
      {R"([[:alpha:]\s]+)", "ab c1d\n", {"ab c", "1", "d\n"}},
      {R"([\S]+)", "a\u0085b c", {"a", "\u0085", "b", " ", "c"}},
      // Oniguruma's table for code points below 256 makes superscripts and fractions words.
      {R"(\w+)", "a\u00b2b \u00bd", {"a\u00b2b", " ", "\u00bd"}},
      // U+1C89 and U+10D40 came in Unicode 16.0 (a letter, a decimal digit): tokenizers'
      // Oniguruma knows them, Debian 12's PCRE2 (Unicode 14.0) does not (unicode_additions.h).
      {R"(\p{L}+)", "a\u1c89b1", {"a\u1c89b", "1"}},
      {R"(\p{Letter}+)", "a\u1c89b1", {"a\u1c89b", "1"}},
      {R"([^\p{L}]+)", "a\u1c89b1", {"a\u1c89b", "1"}},
      {R"(\P{L}+)", "a\u1c89b1", {"a\u1c89b", "1"}},
      {R"(\p{^Lu}+)", "A\u1c89a", {"A\u1c89", "a"}},
      {R"(\d+)", "x1\U00010D40y", {"x", "1\U00010D40", "y"}},
      // Oniguruma's POSIX brackets: [:alpha:] is Alphabetic (U+0345, a mark, is in it),
      // [:punct:] all punctuation and symbols, [:upper:] Uppercase (U+2160, a Roman numeral).
      {R"([[:alpha:]]+)", "a\u0345b1", {"a\u0345b", "1"}},
      {R"([[:punct:]]+)", "a$+b", {"a", "$+", "b"}},
      {R"([[:upper:]x]+)", "\u2160xA1", {"\u2160xA", "1"}},
      {R"([[:^alpha:]]+)", "a12b", {"a", "12", "b"}},
      {R"([^[:^alpha:]]+)", "a12b", {"a", "12", "b"}},
      // An empty match splits the text where it matches; the empty piece itself is dropped.
      {R"(\b)", "a bc d\u00e9", {"a", " ", "bc", " ", "d\u00e9"}},
      {R"((?=b))", "abab", {"a", "ba", "b"}},
      {R"(x*)", "axxbx", {"a", "xx", "b", "x"}},
      {"", "a\u00e9", {"a", "\u00e9"}},
  };
  for (const Case& c : cases) {
    const RegexSplitter splitter(c.pattern, "test");
    std::vector<std::string_view> pieces;
    splitter.split(c.text, pieces);
    EXPECT_EQ(pieces, c.pieces) << c.pattern;
  }
  expect_one_line_error(error_of([] { RegexSplitter(R"(a\u12)", "tok.json"); }),
                        "\\u must be followed by four hex digits");
  expect_one_line_error(error_of([] { RegexSplitter(R"([\W])", "tok.json"); }),
                        "\\W inside a character class is not supported");
  // Oniguruma's class union and intersection; PCRE2 would read '[' and "&&" as literals.
  expect_one_line_error(error_of([] { RegexSplitter(R"([a-c[x-z]]+)", "tok.json"); }),
                        "a character class inside a character class (Oniguruma's union) is not "
                        "supported");
  expect_one_line_error(error_of([] { RegexSplitter(R"([a-z&&[^aeiou]]+)", "tok.json"); }),
                        "'&&' inside a character class (Oniguruma's intersection) is not "
                        "supported");
  expect_one_line_error(error_of([] { RegexSplitter(R"([[:alpah:]])", "tok.json"); }),
                        "unknown POSIX bracket [:alpah:]");
  expect_one_line_error(error_of([] { RegexSplitter(R"([x[:^alpha:]])", "tok.json"); }),
                        "a negated POSIX bracket beside other members of a character class is not "
                        "supported");
  // A single '&', an escaped '[' and a POSIX bracket in a class, and "&&" outside one, are not.
  for (const char* pattern : {R"([&]+)", R"([\[a]+)", R"([[:alpha:]&]+)", R"(a&&b)"})
    EXPECT_NO_THROW(RegexSplitter(pattern, "tok.json")) << pattern;
}

// Rust regex's \w, which single_word added tokens test their neighbours with.
TEST(TokenizerByteLevel, UnicodeWordChar) {
  // U+1C89 (Lu), U+31350 (CJK Extension H) and U+10D40 (Nd) came after PCRE2's Unicode 14.0.
  for (char32_t cp : {U'a', U'Z', U'5', U'_', U'\u00e9', U'\u0301', U'\u0663', U'\u2177', U'\u200d',
                      U'\u4e2d', U'\u1c89', U'\U00031350', U'\U00010D40'})
    EXPECT_TRUE(is_unicode_word_char(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U' ', U'-', U'\u2014', U'\u2460', U'\u00b2', U'\U0001F600', U'\u3000',
                      char32_t{0xFFFFFFFF}})
    EXPECT_FALSE(is_unicode_word_char(cp)) << static_cast<uint32_t>(cp);
}

TEST(TokenizerByteLevel, Utf8InvalidOffset) {
  EXPECT_EQ(utf8_invalid_offset("caf\u00e9 \U0001F600"), std::string_view::npos);
  EXPECT_EQ(utf8_invalid_offset("ab\xff"), 2u);
  EXPECT_EQ(utf8_invalid_offset("\u00e9\xC3("), 2u);
  EXPECT_EQ(utf8_invalid_offset("a\xED\xA0\x80"), 1u);  // an encoded surrogate
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

TEST(Tokenizer, RoundTripEmptyAndEveryUtf8) {
  const Tokenizer& t = small_tokenizer();
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.decode({}), "");
  // Every UTF-8 text round-trips, NUL and 4-byte characters included (the byte-level model);
  // other bytes are refused (TextThatIsNotUtf8IsRefused).
  const std::string text =
      std::string("ok \xc3\xa9 \xf0\x9f\x98\x80 ") + std::string(1, '\0') + "end";
  EXPECT_EQ(t.decode(t.encode(text)), text);
}

// Text of ids whose bytes are not UTF-8: one U+FFFD per maximal subpart of an ill-formed sequence,
// as tokenizers' decoders (Rust's String::from_utf8_lossy) write it; the expected texts are
// Python's bytes.decode("utf-8", "replace"), which follows the same rule.
TEST(Tokenizer, DecodeTextReplacesEachMaximalSubpartOnce) {
  const Tokenizer& t = small_tokenizer();
  const auto ids_of = [&t](std::string_view bytes) {
    std::vector<int32_t> ids;
    for (const char b : bytes)
      ids.push_back(*t.token_id(byte_level_chars()[static_cast<uint8_t>(b)]));
    return ids;
  };
  const std::string r = "\uFFFD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xE8\xAF ", r + " "},               // a truncated three-byte character
      {"a\xE8\xAF", "a" + r},               // ... at the end
      {"\xC0\x80", r + r},                  // an overlong form: no byte starts a character
      {"\xE0\x80\x80", r + r + r},          // ... of three bytes
      {"\xED\xA0\x80", r + r + r},          // an encoded surrogate
      {"\xF0\x9F\x98", r},                  // a truncated four-byte character
      {"\xF4\x90\x80\x80", r + r + r + r},  // above U+10FFFF
      {"\xFF", r},
      {"\xE8\xAF\xE8\xAF\xA2", r + "\u8BE2"},  // the next character is whole
      {"\xF1\x80\x80\xC3\xA9", r + "\u00E9"},
      {"\xF0\x9F\x98\x80", "\U0001F600"},  // well-formed
  };
  for (const auto& [bytes, text] : cases) EXPECT_EQ(t.decode_text(ids_of(bytes)), text) << bytes;
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

// --- added tokens, as tokenizers' AddedVocabulary matches them ----------------------------------

// tiny_json's tokenizer with `added` (content -> flags) appended as added tokens, ids from 262.
Tokenizer with_added(const std::vector<std::pair<std::string, nlohmann::json>>& added) {
  nlohmann::json doc = nlohmann::json::parse(tiny_json(false));
  int64_t id = 13 + 256 - 7;
  for (const auto& [content, flags] : added) {
    nlohmann::json token = flags;
    token["id"] = id++;
    token["content"] = content;
    doc["added_tokens"].push_back(token);
  }
  return Tokenizer::from_json(doc.dump());
}

// The ids of text's bytes, one each (tiny_json merges none of the letters used here but h e l o).
std::vector<int32_t> byte_ids(const Tokenizer& t, std::string_view text) {
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(*t.token_id(byte_level_chars()[static_cast<uint8_t>(c)]));
  return ids;
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// single_word looks at the characters around the match with Unicode \w: '_', combining marks and
// ZWJ are word characters, dashes, emoji and circled digits are not.
TEST(TokenizerAddedTokens, SingleWordUsesTheUnicodeWordClass) {
  const Tokenizer t = with_added({{"qxz", {{"single_word", true}}}});
  const int32_t qxz = *t.token_id("qxz");
  for (const char* text : {"_qxz", "qxz_", "a\u0301qxz", "\u200dqxz", "qxzq", "5qxz"})
    EXPECT_EQ(t.encode(text), byte_ids(t, text)) << text;
  EXPECT_EQ(t.encode("\u2014qxz\u2014"),
            concat({byte_ids(t, "\u2014"), {qxz}, byte_ids(t, "\u2014")}));
  EXPECT_EQ(t.encode("\U0001F600qxz"), concat({byte_ids(t, "\U0001F600"), {qxz}}));
  EXPECT_EQ(t.encode("\u2460qxz!"), concat({byte_ids(t, "\u2460"), {qxz}, byte_ids(t, "!")}));
}

// The text before a match includes an added token matched just before it.
TEST(TokenizerAddedTokens, SingleWordSeesTheAddedTokenBeforeIt) {
  const Tokenizer t =
      with_added({{"qxz", {{"single_word", true}}}, {"<m>", {{"single_word", true}}}});
  EXPECT_EQ(t.encode("qxz<m>"), concat({{*t.token_id("qxz")}, byte_ids(t, "<m>")}));
  EXPECT_EQ(t.encode("qxz <m>"),
            concat({{*t.token_id("qxz")}, byte_ids(t, " "), {*t.token_id("<m>")}}));
}

// Leftmost first, then longest; a match refused by single_word is skipped past, not retried with a
// shorter or later-starting token inside it.
TEST(TokenizerAddedTokens, LeftmostLongestAndRefusedMatchesAreSkipped) {
  const Tokenizer t = with_added({{"qxz", {{"single_word", true}}}, {"xzv", {}}});
  EXPECT_EQ(t.encode("aqxzv"), byte_ids(t, "aqxzv"));
  EXPECT_EQ(t.encode("qxzv"), byte_ids(t, "qxzv"));  // qxz starts first, and is refused
  const Tokenizer u = with_added({{"ab", {}}, {"abc", {}}, {"bcd", {}}});
  EXPECT_EQ(u.encode("abcd"), concat({{*u.token_id("abc")}, byte_ids(u, "d")}));
  EXPECT_EQ(u.encode("xbcdab"),
            concat({byte_ids(u, "x"), {*u.token_id("bcd")}, {*u.token_id("ab")}}));
}

// Tokens with normalized=false (special tokens by default) are matched over the whole text first,
// the normalized ones only inside the pieces left between them.
TEST(TokenizerAddedTokens, NormalizedTokensAreMatchedAfterTheOthers) {
  const Tokenizer t =
      with_added({{"hello", {{"normalized", true}}}, {"lo wor", {{"normalized", false}}}});
  EXPECT_EQ(t.encode("hello world"), concat({{7, 2}, {*t.token_id("lo wor")}, byte_ids(t, "ld")}));
  EXPECT_EQ(t.encode("hello"), (std::vector<int32_t>{*t.token_id("hello")}));
  // A special token without a "normalized" field is matched in the first pass.
  const Tokenizer u = with_added({{"hello", {}}, {"lo wor", {{"special", true}}}});
  EXPECT_EQ(u.encode("hello world"), concat({{7, 2}, {*u.token_id("lo wor")}, byte_ids(u, "ld")}));
}

// lstrip and rstrip take the neighbouring whitespace into the token; lstrip in the first pass
// takes spaces a normalized token would have matched in the second.
TEST(TokenizerAddedTokens, LstripAndRstripAbsorbWhitespace) {
  const Tokenizer t = with_added({{"[MASK]", {{"special", true}, {"lstrip", true}}},
                                  {"  ", {{"normalized", true}}},
                                  {"</s>", {{"special", true}, {"rstrip", true}}}});
  const int32_t mask = *t.token_id("[MASK]");
  const int32_t end = *t.token_id("</s>");
  EXPECT_EQ(t.encode("a  [MASK]"), concat({byte_ids(t, "a"), {mask}}));
  EXPECT_EQ(t.encode("a\u3000\t[MASK]b"), concat({byte_ids(t, "a"), {mask}, byte_ids(t, "b")}));
  EXPECT_EQ(t.encode("x</s> \u00a0 y"), concat({byte_ids(t, "x"), {end}, byte_ids(t, "y")}));
  // lstrip never reaches back into the token before it.
  EXPECT_EQ(t.encode("</s>  [MASK]"), (std::vector<int32_t>{end, mask}));
  EXPECT_EQ(t.encode("a  b"), concat({byte_ids(t, "a"), {*t.token_id("  ")}, byte_ids(t, "b")}));
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

// A normalizer Sequence names its unsupported member, not itself.
TEST(Tokenizer, UnsupportedNormalizerIsNamed) {
  nlohmann::json d = nlohmann::json::parse(tiny_json(false));
  d["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  expect_one_line_error(error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); }),
                        "normalizer 'Lowercase' in the normalizer Sequence is not supported");
  d["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  EXPECT_EQ(Tokenizer::from_json(d.dump()).encode("hello"), (std::vector<int32_t>{10}));
  d["normalizer"] = {{"type", "Lowercase"}};
  expect_one_line_error(error_of([&] { Tokenizer::from_json(d.dump(), "tok.json"); }),
                        "normalizer type 'Lowercase' is not supported");
}

// NFC composes "e" + U+0301 into U+00E9 and maps U+212A KELVIN SIGN to "K" before the byte-level
// BPE (the code point sweep against tokenizers is tests/reference/test_tokenizer_nfc.py).
TEST(Tokenizer, NfcNormalizesBeforeTheByteLevelModel) {
  nlohmann::json d = nlohmann::json::parse(tiny_json(false));
  const Tokenizer plain = Tokenizer::from_json(d.dump());
  d["normalizer"] = {{"type", "NFC"}};
  const Tokenizer nfc = Tokenizer::from_json(d.dump());
  EXPECT_NE(plain.encode("cafe\xCC\x81"), plain.encode("caf\xC3\xA9"));
  EXPECT_EQ(nfc.encode("cafe\xCC\x81"), plain.encode("caf\xC3\xA9"));
  EXPECT_EQ(nfc.encode("\xE2\x84\xAA"), plain.encode("K"));
  EXPECT_EQ(nfc.encode("hello"), plain.encode("hello"));
}

TEST(Tokenizer, TextThatIsNotUtf8IsRefused) {
  const Tokenizer& t = small_tokenizer();
  expect_one_line_error(error_of([&] { (void)t.encode("caf\xC3("); }), "not UTF-8 at byte 3");
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  const Tokenizer& t = small_tokenizer();
  expect_one_line_error(error_of([&] { (void)t.decode({5, 400}); }), "id 400");
  expect_one_line_error(error_of([&] { (void)t.decode({-1}); }), "id -1");
}

}  // namespace
}  // namespace moecore::data
