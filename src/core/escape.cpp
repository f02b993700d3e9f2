#include "core/escape.h"

#include <cstdint>

namespace moecore {

namespace {

void append_hex(std::string& out, uint8_t byte) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  out += "\\x";
  out += kDigits[byte >> 4];
  out += kDigits[byte & 0xF];
}

// Length of the valid UTF-8 sequence starting at text[pos] and its code point; 0 if invalid
// (overlong forms, surrogates and code points above U+10FFFF are invalid, as in Unicode).
size_t utf8_sequence(std::string_view text, size_t pos, char32_t& cp) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  size_t len = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (pos + len > text.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<uint8_t>(text[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string escape_for_message(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const auto byte = static_cast<uint8_t>(text[pos]);
    if (byte >= 0x20 && byte < 0x7F) {
      out += static_cast<char>(byte);
      ++pos;
    } else if (byte == '\n') {
      out += "\\n", ++pos;
    } else if (byte == '\r') {
      out += "\\r", ++pos;
    } else if (byte == '\t') {
      out += "\\t", ++pos;
    } else if (byte < 0x80) {
      append_hex(out, byte), ++pos;
    } else {
      char32_t cp = 0;
      const size_t len = utf8_sequence(text, pos, cp);
      const bool printable = len > 0 && !(cp >= 0x80 && cp <= 0x9F) && cp != 0x2028 && cp != 0x2029;
      if (printable) {
        out.append(text.substr(pos, len));
        pos += len;
      } else {
        for (size_t i = 0; i < (len > 0 ? len : 1); ++i)
          append_hex(out, static_cast<uint8_t>(text[pos + i]));
        pos += len > 0 ? len : 1;
      }
    }
  }
  return out;
}

}  // namespace moecore
