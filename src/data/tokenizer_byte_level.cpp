#include "data/tokenizer_byte_level.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>

#include "core/check.h"
#include "data/unicode_additions.h"

namespace moecore::data {
namespace {

struct ByteTables {
  std::array<char32_t, 256> code_point{};
  std::array<std::string, 256> text;
};

std::string utf8_encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

const ByteTables& tables() {
  static const ByteTables t = [] {
    ByteTables r;
    // Printable Latin-1 bytes stand for themselves; the rest map to 256, 257, ... in byte order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      r.code_point[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
      r.text[static_cast<size_t>(b)] = utf8_encode(r.code_point[static_cast<size_t>(b)]);
    }
    return r;
  }();
  return t;
}

// Bodies of character classes (PCRE2 syntax) for Oniguruma's escapes. White_Space is a fixed
// list, so both it and its complement are written out; the complements stand inside a class
// ([\S\d]), where PCRE2 has no negation.
constexpr std::string_view kWhiteSpaceClassBody =
    R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F})"
    R"(\x{3000})";
constexpr std::string_view kNotWhiteSpaceClassBody =
    R"(\x{00}-\x{08}\x{0E}-\x{1F}\x{21}-\x{84}\x{86}-\x{9F}\x{A1}-\x{167F}\x{1681}-\x{1FFF})"
    R"(\x{200B}-\x{2027}\x{202A}-\x{202E}\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{10FFFF})";
// The properties of Unicode's word class. Alphabetic is L, Nl and Other_Alphabetic (marks, a few
// symbols): what it gained after PCRE2's tables is in the letters' and marks' additions
// (unicode_word_class_body()).
constexpr std::string_view kWordPropertiesClassBody = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
// Ruby syntax's \h: an ASCII hex digit.
constexpr std::string_view kHexDigitClassBody = "0-9A-Fa-f";
constexpr std::string_view kNotHexDigitClassBody =
    R"(\x{00}-\x{2F}\x{3A}-\x{40}\x{47}-\x{60}\x{67}-\x{10FFFF})";

// General categories by their long names (Oniguruma accepts both), loosely matched as
// loose_name() writes them.
constexpr std::array<std::pair<std::string_view, std::string_view>, 41> kCategoryLongNames = {{
    {"letter", "L"},
    {"casedletter", "LC"},
    {"uppercaseletter", "Lu"},
    {"lowercaseletter", "Ll"},
    {"titlecaseletter", "Lt"},
    {"modifierletter", "Lm"},
    {"otherletter", "Lo"},
    {"mark", "M"},
    {"combiningmark", "M"},
    {"nonspacingmark", "Mn"},
    {"spacingmark", "Mc"},
    {"enclosingmark", "Me"},
    {"number", "N"},
    {"decimalnumber", "Nd"},
    {"digit", "Nd"},
    {"letternumber", "Nl"},
    {"othernumber", "No"},
    {"punctuation", "P"},
    {"punct", "P"},
    {"connectorpunctuation", "Pc"},
    {"dashpunctuation", "Pd"},
    {"openpunctuation", "Ps"},
    {"closepunctuation", "Pe"},
    {"initialpunctuation", "Pi"},
    {"finalpunctuation", "Pf"},
    {"otherpunctuation", "Po"},
    {"symbol", "S"},
    {"mathsymbol", "Sm"},
    {"currencysymbol", "Sc"},
    {"modifiersymbol", "Sk"},
    {"othersymbol", "So"},
    {"separator", "Z"},
    {"spaceseparator", "Zs"},
    {"lineseparator", "Zl"},
    {"paragraphseparator", "Zp"},
    {"other", "C"},
    {"format", "Cf"},
    {"control", "Cc"},
    {"privateuse", "Co"},
    {"surrogate", "Cs"},
    {"unassigned", "Cn"},
}};

// Unicode's loose matching of property names: case, spaces, '_' and '-' do not count.
std::string loose_name(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c == ' ' || c == '_' || c == '-') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// The short name of a general category (two letters), a group of them (one letter, or LC) given
// by its short or long name; empty for any other property (scripts, binary properties).
std::string category_code(std::string_view name) {
  const std::string loose = loose_name(name);
  for (const auto& [long_name, short_name] : kCategoryLongNames) {
    if (loose == long_name) return std::string(short_name);
  }
  static constexpr std::array<std::string_view, 38> kCategories = {
      "C",  "Cc", "Cf", "Cn", "Co", "Cs", "L",  "LC", "Ll", "Lm", "Lo", "Lt", "Lu",
      "M",  "Mc", "Me", "Mn", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Pe", "Pf",
      "Pi", "Po", "Ps", "S",  "Sc", "Sk", "Sm", "So", "Z",  "Zl", "Zp", "Zs"};
  for (const std::string_view category : kCategories) {
    if (loose_name(category) == loose) return std::string(category);
  }
  return {};
}

// The code points a general category or group (category_code's short name) gained after PCRE2's
// Unicode tables (unicode_additions.h), as a class body.
std::string category_additions(std::string_view code) {
  std::string body;
  for (const CategoryAdditions& additions : kUnicodeAdditions) {
    const std::string_view category = additions.category;
    const bool member = code == "LC" ? (category == "Lu" || category == "Ll" || category == "Lt")
                        : code.size() == 1 ? category[0] == code[0]
                                           : category == code;
    if (member) body += additions.class_body;
  }
  return body;
}

// kWordPropertiesClassBody with what its properties gained after PCRE2's tables.
const std::string& word_properties_class_body() {
  static const std::string body = std::string(kWordPropertiesClassBody) + category_additions("L") +
                                  category_additions("Nl") + category_additions("M") +
                                  category_additions("Nd") + category_additions("Pc");
  return body;
}

// The Unicode word class of UTS #18 that Rust's regex crate (single_word added tokens) uses: the
// properties and Join_Control (ZWNJ, ZWJ).
const std::string& unicode_word_class_body() {
  static const std::string body = word_properties_class_body() + R"(\x{200C}\x{200D})";
  return body;
}

// Oniguruma's word class (ONIGENC_CTYPE_WORD; PCRE2's \w under UCP is [\p{L}\p{N}_] instead):
// the properties without Join_Control, and the Latin-1 numbers Oniguruma's own table for code
// points below 256 counts as word characters (superscripts two, three and one, the vulgar
// fractions: No).
const std::string& onig_word_class_body() {
  static const std::string body =
      word_properties_class_body() + R"(\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
  return body;
}

// The code points a POSIX bracket matches beyond its general categories (unicode_additions.h).
std::string_view posix_bracket_extras(std::string_view bracket) {
  for (const PosixBracketExtras& extras : kPosixBracketExtras)
    if (extras.bracket == bracket) return extras.class_body;
  return {};
}

// The class body of Oniguruma's POSIX bracket [:name:] on Unicode text (PCRE2's under UCP are
// other sets: [:alpha:] is \p{L} there, [:punct:] leaves out most symbols, [:space:] counts
// U+180E); empty for a name Oniguruma does not know.
std::string onig_posix_class_body(std::string_view name) {
  const std::string alpha = R"(\p{L}\p{Nl})" + category_additions("L") + category_additions("Nl") +
                            std::string(posix_bracket_extras("alpha"));
  const std::string graph = R"(\p{L}\p{M}\p{N}\p{P}\p{S}\p{Cf}\p{Co})" + category_additions("L") +
                            category_additions("M") + category_additions("N") +
                            category_additions("P") + category_additions("S") +
                            category_additions("Cf") + category_additions("Co");
  if (name == "alpha") return alpha;
  if (name == "alnum") return alpha + R"(\p{Nd})" + category_additions("Nd");
  if (name == "digit") return R"(\p{Nd})" + category_additions("Nd");
  if (name == "upper")
    return R"(\p{Lu})" + category_additions("Lu") + std::string(posix_bracket_extras("upper"));
  if (name == "lower")
    return R"(\p{Ll})" + category_additions("Ll") + std::string(posix_bracket_extras("lower"));
  if (name == "space") return std::string(kWhiteSpaceClassBody);
  if (name == "blank") return R"(\x{09}\p{Zs})" + category_additions("Zs");
  if (name == "punct") return R"(\p{P}\p{S})" + category_additions("P") + category_additions("S");
  if (name == "cntrl") return R"(\p{Cc})";
  if (name == "xdigit") return std::string(kHexDigitClassBody);
  if (name == "word") return word_properties_class_body();
  if (name == "graph") return graph;
  if (name == "print") return graph + R"(\p{Zs})" + category_additions("Zs");
  return {};
}

bool is_hex_digit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  return tables().text;
}

char32_t byte_level_code_point(uint8_t b) {
  return tables().code_point[b];
}

int byte_level_byte(char32_t cp) {
  if (cp >= '!' && cp <= '~') return static_cast<int>(cp);
  if ((cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return static_cast<int>(cp);
  if (cp < 256 || cp >= 256 + 68) return -1;
  static const std::array<int, 68> inverse = [] {
    std::array<int, 68> r{};
    for (int b = 0; b < 256; ++b) {
      const char32_t c = tables().code_point[static_cast<size_t>(b)];
      if (c >= 256) r[c - 256] = b;
    }
    return r;
  }();
  return inverse[cp - 256];
}

std::string byte_level_map(std::string_view bytes) {
  const auto& text = tables().text;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += text[static_cast<uint8_t>(c)];
  return out;
}

size_t utf8_next(std::string_view text, size_t pos, char32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  cp = 0xFFFFFFFF;
  size_t len = 0;
  char32_t value = 0;
  char32_t min = 0;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, value = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, value = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, value = b0 & 0x07, min = 0x10000;
  } else {
    return 1;
  }
  if (pos + len > text.size()) return 1;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return 1;
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 1;
  cp = value;
  return len;
}

size_t utf8_maximal_subpart(std::string_view text, size_t pos) {
  // The well-formed sequences (Unicode's table 3-7): the leading byte fixes how many continuation
  // bytes follow and the range of the first of them; the others are 80..BF.
  const auto b0 = static_cast<uint8_t>(text[pos]);
  size_t continuations = 0;
  uint8_t first_low = 0x80, first_high = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    continuations = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    continuations = 2;
    if (b0 == 0xE0) first_low = 0xA0;   // no overlong forms
    if (b0 == 0xED) first_high = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    continuations = 3;
    if (b0 == 0xF0) first_low = 0x90;   // no overlong forms
    if (b0 == 0xF4) first_high = 0x8F;  // nothing above U+10FFFF
  }
  size_t length = 1;
  for (size_t i = 0; i < continuations && pos + length < text.size(); ++i, ++length) {
    const auto b = static_cast<uint8_t>(text[pos + length]);
    if (b < (i == 0 ? first_low : 0x80) || b > (i == 0 ? first_high : 0xBF)) break;
  }
  return length;
}

size_t utf8_invalid_offset(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = 0;
    const size_t len = utf8_next(text, pos, cp);
    if (cp == 0xFFFFFFFF) return pos;
    pos += len;
  }
  return std::string_view::npos;
}

bool utf8_valid(std::string_view text) {
  return utf8_invalid_offset(text) == std::string_view::npos;
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_unicode_word_char(char32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  // PCRE2's Unicode tables answer the property questions; one compiled class serves every thread.
  static const std::shared_ptr<pcre2_code> word_class = [] {
    const std::string pattern = fmt::format("[{}]", unicode_word_class_body());
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error_code, &error_offset, nullptr);
    MOE_CHECK(code != nullptr, "[tokenizer] cannot compile the word class: {}",
              pcre2_error_text(error_code));
    return std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  }();
  const std::string text = utf8_encode(cp);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  MOE_CHECK(match != nullptr, "[tokenizer] out of memory creating regex match data");
  return pcre2_match(word_class.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                     match.get(), nullptr) >= 0;
}

std::string onig_to_pcre2_pattern(std::string_view pattern, const std::string& what) {
  std::string out;
  out.reserve(pattern.size() + 64);
  // Outside a class a class body is wrapped in [...] (or [^...]); inside one it is spliced in.
  const auto put_class = [&](bool in_class, std::string_view body, bool negated) {
    if (in_class) {
      out += body;
    } else {
      out += negated ? "[^" : "[";
      out += body;
      out += ']';
    }
  };
  const std::string word = fmt::format("[{}]", onig_word_class_body());
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        put_class(in_class, kWhiteSpaceClassBody, false);
      } else if (e == 'S') {
        put_class(in_class, kNotWhiteSpaceClassBody, false);
      } else if (e == 'h') {
        put_class(in_class, kHexDigitClassBody, false);
      } else if (e == 'H') {
        put_class(in_class, kNotHexDigitClassBody, false);
      } else if (e == 'w') {
        put_class(in_class, onig_word_class_body(), false);
      } else if (e == 'W') {
        MOE_CHECK(!in_class,
                  "[tokenizer] {}: regex '{}': \\W inside a character class is not supported", what,
                  pattern);
        put_class(false, onig_word_class_body(), true);
      } else if (e == 'd' || (e == 'D' && !in_class)) {
        // Oniguruma's \d is Unicode's decimal numbers, as PCRE2's under UCP, plus what Nd gained.
        put_class(in_class, "\\d" + category_additions("Nd"), e == 'D');
      } else if ((e == 'p' || e == 'P') && i + 1 < pattern.size() && pattern[i + 1] == '{') {
        // \p{Name}, \p{^Name}, \P{Name}: PCRE2's property plus the code points it gained since
        // PCRE2's Unicode tables. A negated one inside a class stays PCRE2's alone (a class cannot
        // take those code points out again).
        const size_t close = pattern.find('}', i + 2);
        MOE_CHECK(close != std::string_view::npos, "[tokenizer] {}: regex '{}': \\{} without '}}'",
                  what, pattern, e);
        const std::string_view escape = pattern.substr(i - 1, close + 2 - i);
        std::string_view name = pattern.substr(i + 2, close - i - 2);
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        // PCRE2 10.42 knows the categories by their short names only.
        const std::string code = category_code(name);
        if (code.empty()) {
          out += escape;
        } else if (negated && in_class) {
          out += fmt::format("\\P{{{}}}", code);
        } else {
          put_class(in_class, fmt::format("\\p{{{}}}{}", code, category_additions(code)), negated);
        }
        i = close;
      } else if ((e == 'b' || e == 'B') && !in_class) {
        // A word boundary by Oniguruma's word class (inside a class \b is a backspace, as in both).
        out += e == 'b' ? fmt::format("(?:(?<={0})(?!{0})|(?<!{0})(?={0}))", word)
                        : fmt::format("(?:(?<={0})(?={0})|(?<!{0})(?!{0}))", word);
      } else if (e == 'v') {
        out += "\\x{0B}";  // Ruby's \v is the vertical tab; PCRE2's is vertical space.
      } else if (e == 'u') {
        const std::string_view digits = pattern.substr(i + 1, 4);
        MOE_CHECK(digits.size() == 4 && std::all_of(digits.begin(), digits.end(), is_hex_digit),
                  "[tokenizer] {}: regex '{}': \\u must be followed by four hex digits", what,
                  pattern);
        out += fmt::format("\\x{{{}}}", digits);
        i += 4;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // A POSIX bracket ([:alpha:], [:^alpha:]) inside a class: Oniguruma's set, spliced in.
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        std::string_view name = pattern.substr(i + 2, close - i - 2);
        const bool negated = !name.empty() && name[0] == '^';
        if (negated) name.remove_prefix(1);
        const std::string body = onig_posix_class_body(name);
        MOE_CHECK(!body.empty(), "[tokenizer] {}: regex '{}': unknown POSIX bracket [:{}:]", what,
                  pattern, name);
        if (negated) {
          // A class can take in a set but not its complement: only a class that is the negated
          // bracket alone ([[:^alpha:]], [^[:^alpha:]]) is written, as the bracket's set negated.
          const bool first =
              pattern[i - 1] == '[' || (pattern[i - 1] == '^' && pattern[i - 2] == '[');
          MOE_CHECK(first && close + 2 < pattern.size() && pattern[close + 2] == ']',
                    "[tokenizer] {}: regex '{}': a negated POSIX bracket beside other members of a "
                    "character class is not supported",
                    what, pattern);
          if (out.back() == '^') {
            out.pop_back();
          } else {
            out += '^';
          }
        }
        out += body;
        i = close + 1;
        continue;
      }
    }
    // Oniguruma's class union ([a-c[x-z]]) and intersection ([a-z&&[^aeiou]]): to PCRE2 a '['
    // and "&&" in a class are literals, a different set of characters, so they are refused.
    MOE_CHECK(!(in_class && c == '['),
              "[tokenizer] {}: regex '{}': a character class inside a character class (Oniguruma's "
              "union) is not supported",
              what, pattern);
    MOE_CHECK(!(in_class && c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&'),
              "[tokenizer] {}: regex '{}': '&&' inside a character class (Oniguruma's "
              "intersection) is not supported",
              what, pattern);
    if (!in_class && c == '(' && i + 2 < pattern.size() && pattern[i + 1] == '?') {
      // Ruby's option m is dot-matches-newline, PCRE2's s ("(?m)", "(?im-x:...)").
      size_t end = i + 2;
      while (end < pattern.size() &&
             std::string_view("imx-").find(pattern[end]) != std::string_view::npos)
        ++end;
      if (end > i + 2 && end < pattern.size() && (pattern[end] == ':' || pattern[end] == ')')) {
        out += "(?";
        for (size_t k = i + 2; k < end; ++k) out += pattern[k] == 'm' ? 's' : pattern[k];
        i = end - 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexSplitter::RegexSplitter(std::string_view pattern, const std::string& what) {
  const std::string translated = onig_to_pcre2_pattern(pattern, what);
  // Oniguruma's ^ and $ are line anchors and its only newline is LF (. stops there, $ matches
  // before it): PCRE2_MULTILINE with the newline convention set rather than PCRE2's build default.
  const std::unique_ptr<pcre2_compile_context, void (*)(pcre2_compile_context*)> context(
      pcre2_compile_context_create(nullptr), pcre2_compile_context_free);
  MOE_CHECK(context != nullptr, "[tokenizer] out of memory creating a regex compile context");
  pcre2_set_newline(context.get(), PCRE2_NEWLINE_LF);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &error_code,
                    &error_offset, context.get());
  MOE_CHECK(code != nullptr,
            "[tokenizer] {}: cannot compile regex '{}' (as '{}' for PCRE2) at offset {}: {}", what,
            pattern, translated, error_offset, pcre2_error_text(error_code));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // Optional: matching falls back to the interpreter.
  code_ =
      std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  auto* code = static_cast<const pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  MOE_CHECK(match != nullptr, "[tokenizer] out of memory creating regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t emitted = 0;  // end of the last piece
  size_t offset = 0;   // where the next search starts
  while (offset < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), offset, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_JIT, match.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MOE_CHECK(rc >= 0, "[tokenizer] regex match failed at byte {}: {}", offset,
              pcre2_error_text(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    // The gap before a match is a piece of its own, also before an empty match (`\b`, a
    // lookahead): tokenizers splits there too and drops the empty piece.
    if (start > emitted) {
      out.push_back(text.substr(emitted, start - emitted));
      emitted = start;
    }
    if (end == start) {  // Oniguruma's find_iter: step over one character and search again.
      char32_t cp = 0;
      offset = start + utf8_next(text, start, cp);
      continue;
    }
    out.push_back(text.substr(start, end - start));
    emitted = offset = end;
  }
  if (emitted < text.size()) out.push_back(text.substr(emitted));
}

}  // namespace moecore::data
