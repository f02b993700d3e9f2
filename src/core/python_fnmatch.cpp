#include "core/python_fnmatch.h"

#include <string>
#include <utility>
#include <vector>

namespace moecore {

namespace {

// One position of a pattern: a literal character, ?, *, or a bracket set.
struct Token {
  enum Kind { kLiteral, kAnyOne, kStar, kSet };
  explicit Token(Kind token_kind, char token_literal = 0)
      : kind(token_kind), literal(token_literal) {}

  Kind kind;
  char literal;
  bool negated = false;
  bool empty = false;                         // a set that matches no character
  std::vector<std::pair<char, char>> ranges;  // a character c is [c, c]

  bool matches(char c) const {
    switch (kind) {
      case kLiteral:
        return c == literal;
      case kAnyOne:
        return true;
      case kStar:
        return false;
      case kSet:
        if (empty) return negated;
        for (const auto& [lo, hi] : ranges)
          if (static_cast<unsigned char>(c) >= static_cast<unsigned char>(lo) &&
              static_cast<unsigned char>(c) <= static_cast<unsigned char>(hi))
            return !negated;
        return negated;
    }
    return false;
  }
};

// The set between '[' at pattern[open - 1] and ']' at pattern[close], as fnmatch.translate
// builds it: the text cut at the hyphens that make ranges into chunks, a range whose ends are in
// the wrong order dropped with its ends, hyphens inside a chunk literal, a leading '!' negating.
Token parse_set(std::string_view pattern, size_t open, size_t close) {
  Token token(Token::kSet);
  std::vector<std::string> chunks;
  const std::string_view stuff = pattern.substr(open, close - open);
  if (stuff.find('-') == std::string_view::npos) {
    chunks.emplace_back(stuff);
  } else {
    size_t i = open;
    size_t k = pattern[i] == '!' ? i + 2 : i + 1;
    while (true) {
      const size_t hyphen = k < close ? pattern.substr(0, close).find('-', k) : std::string::npos;
      if (hyphen == std::string_view::npos) break;
      chunks.emplace_back(pattern.substr(i, hyphen - i));
      i = hyphen + 1;
      k = hyphen + 3;
    }
    const std::string_view last = pattern.substr(i, close - i);
    if (!last.empty())
      chunks.emplace_back(last);
    else
      chunks.back() += '-';
    for (size_t k2 = chunks.size() - 1; k2 > 0; --k2) {
      std::string& before = chunks[k2 - 1];
      const std::string& after = chunks[k2];
      if (!before.empty() && !after.empty() &&
          static_cast<unsigned char>(before.back()) > static_cast<unsigned char>(after.front())) {
        before = before.substr(0, before.size() - 1) + after.substr(1);
        chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(k2));
      }
    }
  }
  std::string joined;
  for (size_t c = 0; c < chunks.size(); ++c) joined += (c == 0 ? "" : "-") + chunks[c];
  if (joined.empty()) {
    token.empty = true;
    return token;
  }
  if (joined == "!") {  // a negated empty set: any character
    token.empty = true;
    token.negated = true;
    return token;
  }
  token.negated = joined.front() == '!';
  if (token.negated) chunks.front().erase(0, 1);
  // Each chunk's characters; the hyphen between two chunks a range from the one's last
  // character to the next one's first.
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (const char ch : chunks[c]) token.ranges.emplace_back(ch, ch);
    if (c > 0 && !chunks[c - 1].empty() && !chunks[c].empty())
      token.ranges.emplace_back(chunks[c - 1].back(), chunks[c].front());
  }
  return token;
}

std::vector<Token> parse(std::string_view pattern) {
  std::vector<Token> tokens;
  const size_t n = pattern.size();
  size_t i = 0;
  while (i < n) {
    const char c = pattern[i++];
    if (c == '*') {
      if (tokens.empty() || tokens.back().kind != Token::kStar) tokens.emplace_back(Token::kStar);
    } else if (c == '?') {
      tokens.emplace_back(Token::kAnyOne);
    } else if (c == '[') {
      size_t j = i;
      if (j < n && pattern[j] == '!') ++j;
      if (j < n && pattern[j] == ']') ++j;
      while (j < n && pattern[j] != ']') ++j;
      if (j >= n) {
        tokens.emplace_back(Token::kLiteral, '[');
      } else {
        tokens.push_back(parse_set(pattern, i, j));
        i = j + 1;
      }
    } else {
      tokens.emplace_back(Token::kLiteral, c);
    }
  }
  return tokens;
}

}  // namespace

bool python_fnmatch(std::string_view name, std::string_view pattern) {
  const std::vector<Token> tokens = parse(pattern);
  // The usual backtracking over the last star: linear in practice for names and globs.
  size_t t = 0, s = 0;
  size_t star = std::string_view::npos, star_s = 0;
  while (s < name.size()) {
    if (t < tokens.size() && tokens[t].kind == Token::kStar) {
      star = t++;
      star_s = s;
    } else if (t < tokens.size() && tokens[t].matches(name[s])) {
      ++t;
      ++s;
    } else if (star != std::string_view::npos) {
      t = star + 1;
      s = ++star_s;
    } else {
      return false;
    }
  }
  while (t < tokens.size() && tokens[t].kind == Token::kStar) ++t;
  return t == tokens.size();
}

}  // namespace moecore
