// Byte-level pieces shared by the tokenizer and the BPE trainer: GPT-2's bytes_to_unicode table,
// UTF-8 helpers, and a regex splitter (PCRE2) that behaves like Hugging Face tokenizers' Oniguruma
// split with SplitDelimiterBehavior::Isolated.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moecore::data {

// The GPT-2 / tokenizers ByteLevel pre-tokenization regex, as written in tokenizer.json files.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2 bytes_to_unicode: byte b -> the UTF-8 text of the printable code point that stands for it.
const std::array<std::string, 256>& byte_level_chars();
// The code point that stands for byte b.
char32_t byte_level_code_point(uint8_t b);
// Inverse of byte_level_code_point: the byte a code point stands for, or -1.
int byte_level_byte(char32_t cp);
// Every byte of `bytes` replaced by its byte-level character.
std::string byte_level_map(std::string_view bytes);

// Decodes one UTF-8 code point at text[pos]; returns its length in bytes (1 for an invalid byte,
// which is then returned as cp = 0xFFFFFFFF).
size_t utf8_next(std::string_view text, size_t pos, char32_t& cp);
// At `pos`, where utf8_next found no character: the length of the ill-formed sequence's maximal
// subpart (the longest start of a well-formed one, at least one byte), which one U+FFFD replaces
// in Unicode's recommended practice, as Rust's String::from_utf8_lossy (tokenizers' decoders) and
// Python's bytes.decode("utf-8", "replace") do.
size_t utf8_maximal_subpart(std::string_view text, size_t pos);
// The offset of the first byte that does not start a valid UTF-8 character, or npos.
size_t utf8_invalid_offset(std::string_view text);
bool utf8_valid(std::string_view text);
// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s accept).
bool is_unicode_whitespace(char32_t cp);
// Rust regex's Unicode \w (UTS #18: Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control), which tokenizers' single_word added tokens test their neighbours with.
bool is_unicode_word_char(char32_t cp);

// Rewrites an Oniguruma (Ruby syntax) pattern from tokenizer.json for PCRE2, which compiles it
// with PCRE2_MULTILINE and LF newlines (Oniguruma's ^ and $ are line anchors). Escapes whose
// meaning differs become explicit classes: \s \S (White_Space; PCRE2's leaves out U+0085), \w \W
// \b \B (Oniguruma's word: Alphabetic, Mark, Decimal_Number, Connector_Punctuation), \h \H (hex
// digits; PCRE2's are horizontal space), \v (U+000B), \uHHHH; Ruby's (?m) is PCRE2's (?s).
// `what` names the caller in errors.
std::string onig_to_pcre2_pattern(std::string_view pattern, const std::string& what);

// Splits text into the regex's matches and the gaps between them, in order, none empty
// (tokenizers' Isolated behaviour: an empty match splits the text where it matches). Thread-safe;
// copies share the compiled pattern.
class RegexSplitter {
 public:
  // `pattern` in tokenizer.json (Oniguruma) syntax; `what` names the caller in errors.
  RegexSplitter(std::string_view pattern, const std::string& what);
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
};

}  // namespace moecore::data
