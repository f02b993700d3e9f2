#include "data/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <unordered_map>

#include "core/check.h"
#include "data/bpe_pair.h"
#include "data/tokenizer_byte_level.h"
#include "data/unicode_additions.h"
#include "io/file_util.h"

namespace moecore::data {
namespace {

using Json = nlohmann::json;

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  // What the matcher looks for: the content, or its NFC form for a normalized token under an NFC
  // normalizer (tokenizers builds its normalized trie from the normalized contents).
  std::string pattern;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool special = false;
  // Matched in the normalized text, after the tokens that are not (tokenizers' two passes).
  bool normalized = true;
};

// One piece of the text once the added tokens are taken out: an added token, or text for the
// pre-tokenizer and the model.
struct TextPiece {
  std::string_view text;
  const AddedToken* token = nullptr;
};

// One pre-tokenization step: split every piece (regex or literal, Isolated), optionally after
// prepending a space (ByteLevel add_prefix_space).
struct PreStep {
  std::optional<RegexSplitter> regex;
  std::string literal;
  bool add_prefix_space = false;
};

// Replaces line breaks so that error messages stay on one line.
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

// A field of `object`, or `fallback` when it is absent or null; any other type is an error naming
// the key and the value (the JSON library's own message names neither).
bool bool_field(const Json& object, const char* key, bool fallback, const std::string& where) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return fallback;
  MOE_CHECK(object[key].is_boolean(), "[tokenizer] {}: '{}' must be true or false, not {}", where,
            key, object[key].dump());
  return object[key].get<bool>();
}

std::string string_field(const Json& object, const char* key, const std::string& fallback,
                         const std::string& where) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return fallback;
  MOE_CHECK(object[key].is_string(), "[tokenizer] {}: '{}' must be a string, not {}", where, key,
            object[key].dump());
  return object[key].get<std::string>();
}

// Where the last character of a non-empty text starts, and the character in cp (0xFFFFFFFF when
// the text does not end in a valid UTF-8 character: then its last byte alone).
size_t last_code_point(std::string_view text, char32_t& cp) {
  size_t pos = text.size() - 1;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80 && text.size() - pos < 4)
    --pos;
  if (utf8_next(text, pos, cp) != text.size() - pos) {
    cp = 0xFFFFFFFF;
    pos = text.size() - 1;
  }
  return pos;
}

// tokenizers' ends_with_word / starts_with_word (regexes \w$ and ^\w).
bool ends_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  char32_t cp = 0;
  last_code_point(text, cp);
  return is_unicode_word_char(cp);
}

bool starts_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  char32_t cp = 0;
  utf8_next(text, 0, cp);
  return is_unicode_word_char(cp);
}

// Where the whitespace that ends text begins (tokenizers' space_leftmost_at_end, regex \s*$).
size_t trailing_whitespace_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    char32_t cp = 0;
    const size_t start = last_code_point(text.substr(0, end), cp);
    if (!is_unicode_whitespace(cp)) break;
    end = start;
  }
  return end;
}

// The length of the whitespace that starts text (space_rightmost_at_start, regex ^\s*).
size_t leading_whitespace_length(std::string_view text) {
  size_t end = 0;
  while (end < text.size()) {
    char32_t cp = 0;
    const size_t len = utf8_next(text, end, cp);
    if (!is_unicode_whitespace(cp)) break;
    end += len;
  }
  return end;
}

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<uint8_t>(c) < 0x80; });
}

// utf8proc's NFC of valid UTF-8 text.
std::string utf8proc_nfc(std::string_view text) {
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  MOE_CHECK(length >= 0, "[tokenizer] NFC normalization failed: {}", utf8proc_errmsg(length));
  std::string out(reinterpret_cast<const char*>(composed), static_cast<size_t>(length));
  std::free(composed);
  return out;
}

bool is_nfc_inert(char32_t cp) {
  const auto after =
      std::upper_bound(kNfcInertRanges.begin(), kNfcInertRanges.end(), cp,
                       [](char32_t value, const std::pair<char32_t, char32_t>& range) {
                         return value < range.first;
                       });
  return after != kNfcInertRanges.begin() && cp <= std::prev(after)->second;
}

// Unicode Normalization Form C of valid UTF-8 text as tokenizers computes it. utf8proc has
// Unicode 15.0's tables, tokenizers' normalizer Unicode 9.0's: to it a mark or composition part
// assigned since is a starter that composes with nothing (kNfcInertRanges), so the text between
// such code points is normalized on its own and they stay as they are. The same output as
// tokenizers' over every code point and over random combining sequences of old and new marks
// (tests/reference/test_tokenizer_nfc.py).
std::string nfc_normalize(std::string_view text) {
  std::string out;
  size_t run_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = 0;
    const size_t length = utf8_next(text, pos, cp);
    if (cp >= kNfcInertRanges.front().first && is_nfc_inert(cp)) {
      if (pos > run_start) out += utf8proc_nfc(text.substr(run_start, pos - run_start));
      out.append(text, pos, length);
      run_start = pos + length;
    }
    pos += length;
  }
  if (run_start == 0) return utf8proc_nfc(text);
  if (run_start < text.size()) out += utf8proc_nfc(text.substr(run_start));
  return out;
}

// One of tokenizers' two added-token tries (the tokens matched before normalization, or those
// matched after) and its AddedVocabulary::find_matches.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // The tokens whose `normalized` equals the given one; `tokens` must outlive the matcher.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized) {
    for (const AddedToken& token : tokens) {
      if (token.normalized != normalized) continue;
      by_first_byte_[static_cast<uint8_t>(token.pattern[0])].push_back(&token);
      empty_ = false;
    }
    // Longest first: the first that matches at a position is the longest there. Two tokens with
    // one pattern (normalized forms can coincide: K and U+212A under NFC) match as tokenizers'
    // trie takes them: the special tokens first, then the others, each in the file's order.
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [](const AddedToken* x, const AddedToken* y) {
        if (x->pattern.size() != y->pattern.size()) return x->pattern.size() > y->pattern.size();
        return x->special && !y->special;
      });
    }
  }

  // Splits sentence into pieces (appended to `out`) as tokenizers does: the leftmost-longest
  // non-overlapping matches (aho-corasick, MatchKind::LeftmostLongest) are found on the raw
  // sentence; a match refused by single_word is skipped past, not retried shorter; lstrip and
  // rstrip then widen the accepted ones over whitespace (never back past the previous piece's end,
  // but rstrip may run over later matches, which are still emitted, as tokenizers does).
  void split(std::string_view sentence, std::vector<TextPiece>& out) const {
    size_t piece_start = 0;  // tokenizers' start_offset: the end of the last accepted token
    size_t search_from = 0;
    size_t match_start = 0;
    while (const AddedToken* token = find(sentence, search_from, match_start)) {
      size_t start = match_start;
      size_t stop = start + token->pattern.size();
      search_from = stop;
      // Word boundaries are judged on the whole sentence: an added token just before counts.
      if (token->single_word && (ends_with_word_char(sentence.substr(0, start)) ||
                                 starts_with_word_char(sentence.substr(stop)))) {
        continue;
      }
      if (token->lstrip)
        start = std::max(trailing_whitespace_start(sentence.substr(0, start)), piece_start);
      if (token->rstrip) stop += leading_whitespace_length(sentence.substr(stop));
      if (piece_start < start)
        out.push_back({sentence.substr(piece_start, start - piece_start), nullptr});
      out.push_back({{}, token});
      piece_start = stop;
    }
    if (piece_start < sentence.size()) out.push_back({sentence.substr(piece_start), nullptr});
  }

 private:
  // The longest token that matches at the first position >= from where any does; sets start.
  const AddedToken* find(std::string_view text, size_t from, size_t& start) const {
    if (empty_) return nullptr;
    for (size_t pos = from; pos < text.size(); ++pos) {
      for (const AddedToken* token : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
        if (text.substr(pos, token->pattern.size()) == token->pattern) {
          start = pos;
          return token;
        }
      }
    }
    return nullptr;
  }

  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
  bool empty_ = true;
};

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  std::string json_text;
  bool nfc = false;
  std::vector<PreStep> steps;
  StringMap<int32_t> vocab;
  std::vector<std::string> id_token;  // vocab/added string per id; empty where no token has it
  std::vector<std::string> id_bytes;  // what decode emits per id
  std::vector<bool> id_present;
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, MergeInfo, PairHash> merges;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_added;         // normalized=false: matched first, in the raw text
  AddedTokenMatcher normalized_added;  // normalized=true: in the pieces the first pass left
  StringMap<int32_t> added_ids;
  std::optional<int32_t> eos;
  int64_t size = 0;

  void bpe_word(std::string_view bytes, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids,
                      StringMap<std::pair<uint32_t, uint32_t>>& cache,
                      std::vector<int32_t>& pool) const;
};

namespace {

// tokenizers' Word::merge_all: a min-heap of (rank, position) over adjacent pairs; stale entries
// are skipped when the pair at that position no longer yields the same new id.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;
};
struct HeapEntry {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator>(const HeapEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Tokenizer::Impl::bpe_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(byte_level_map(bytes));
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  auto add = [&](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  // A run of bytes without a byte token becomes unk (fused into one when fuse_unk).
  // pending_unk_len == 0: no pending unk. (Plain ints: GCC 12 -O3 misreports std::optional here.)
  int32_t pending_unk_len = 0;
  const int32_t unk = unk_id ? *unk_id : -1;
  for (char c : bytes) {
    const int32_t id = byte_id[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk_len > 0) add(unk, pending_unk_len);
      pending_unk_len = 0;
      add(id, 1);
    } else if (unk >= 0) {
      if (pending_unk_len > 0 && fuse_unk) {
        pending_unk_len += 1;
      } else {
        if (pending_unk_len > 0) add(unk, pending_unk_len);
        pending_unk_len = 1;
      }
    }
  }
  if (pending_unk_len > 0) add(unk, pending_unk_len);

  std::vector<HeapEntry> heap;
  const auto lookup = [&](int32_t a, int32_t b) -> const MergeInfo* {
    auto it = merges.find(pair_key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  };
  const auto push = [&](HeapEntry e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeInfo* m = lookup(symbols[i].id, symbols[i + 1].id)) {
      push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const HeapEntry top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t right_pos = cur.next;
    const Symbol right = symbols[static_cast<size_t>(right_pos)];
    const MergeInfo* m = lookup(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[static_cast<size_t>(right_pos)].len = 0;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeInfo* pm = lookup(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        push({pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeInfo* nm = lookup(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

void Tokenizer::Impl::encode_segment(std::string_view segment, std::vector<int32_t>& ids,
                                     StringMap<std::pair<uint32_t, uint32_t>>& cache,
                                     std::vector<int32_t>& pool) const {
  if (segment.empty()) return;
  std::deque<std::string> owned;  // pieces with a prepended space
  std::vector<std::string_view> pieces{segment};
  std::vector<std::string_view> next;
  for (const PreStep& step : steps) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
        // Built by append: GCC 12 -O3 misreports `" " + std::string(piece)` under -Wrestrict.
        std::string prefixed(1, ' ');
        prefixed.append(piece);
        owned.push_back(std::move(prefixed));
        piece = owned.back();
      }
      if (step.regex) {
        step.regex->split(piece, next);
      } else if (!step.literal.empty()) {
        size_t from = 0;
        for (size_t at = piece.find(step.literal); at != std::string_view::npos;
             at = piece.find(step.literal, from)) {
          if (at > from) next.push_back(piece.substr(from, at - from));
          next.push_back(piece.substr(at, step.literal.size()));
          from = at + step.literal.size();
        }
        if (from < piece.size()) next.push_back(piece.substr(from));
      } else if (!piece.empty()) {
        next.push_back(piece);
      }
    }
    pieces.swap(next);
  }
  for (std::string_view word : pieces) {
    auto it = cache.find(word);
    if (it == cache.end()) {
      const auto offset = static_cast<uint32_t>(pool.size());
      bpe_word(word, pool);
      it = cache
               .emplace(std::string(word),
                        std::make_pair(offset, static_cast<uint32_t>(pool.size() - offset)))
               .first;
    }
    const auto [offset, len] = it->second;
    ids.insert(ids.end(), pool.begin() + offset, pool.begin() + offset + len);
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  const io::MappedFile file = io::MappedFile::open(path, "[tokenizer]");
  return from_json(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()), path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  impl->json_text = std::string(json_text);
  impl->byte_id.fill(-1);
  const std::string& where = impl->origin;
  Json doc;
  try {
    doc = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail("[tokenizer] {}: invalid JSON: {}", where, one_line(e.what()));
  }
  try {
    MOE_CHECK(doc.is_object(), "[tokenizer] {}: top level is not a JSON object", where);
    // Normalizer.
    if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
      const Json& n = doc["normalizer"];
      const std::string type = string_field(n, "type", std::string("?"), where);
      if (type == "Sequence") {
        MOE_CHECK(n.contains("normalizers") && n["normalizers"].is_array(),
                  "[tokenizer] {}: normalizer Sequence without a 'normalizers' list", where);
        for (const Json& member : n["normalizers"]) {
          const std::string member_type = string_field(member, "type", std::string("?"), where);
          MOE_CHECK(member_type == "NFC",
                    "[tokenizer] {}: normalizer '{}' in the normalizer Sequence is not supported "
                    "(only NFC is)",
                    where, member_type);
          impl->nfc = true;
        }
      } else {
        MOE_CHECK(type == "NFC",
                  "[tokenizer] {}: normalizer type '{}' is not supported (only NFC is)", where,
                  type);
        impl->nfc = true;
      }
    }
    // Pre-tokenizer.
    MOE_CHECK(doc.contains("pre_tokenizer") && doc["pre_tokenizer"].is_object(),
              "[tokenizer] {}: pre_tokenizer must be ByteLevel or a Sequence ending in ByteLevel",
              where);
    std::vector<Json> steps;
    const Json& pre = doc["pre_tokenizer"];
    if (string_field(pre, "type", std::string(), where) == "Sequence") {
      for (const Json& s : pre.at("pretokenizers")) steps.push_back(s);
    } else {
      steps.push_back(pre);
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const Json& s = steps[i];
      const std::string type = string_field(s, "type", std::string("?"), where);
      PreStep step;
      if (type == "ByteLevel") {
        MOE_CHECK(i + 1 == steps.size(),
                  "[tokenizer] {}: ByteLevel must be the last pre-tokenizer step", where);
        step.add_prefix_space = bool_field(s, "add_prefix_space", false, where);
        if (bool_field(s, "use_regex", true, where)) step.regex.emplace(kGpt2SplitPattern, where);
      } else if (type == "Split") {
        MOE_CHECK(string_field(s, "behavior", std::string(), where) == "Isolated" &&
                      !bool_field(s, "invert", false, where),
                  "[tokenizer] {}: Split pre-tokenizer supports only behavior Isolated, invert "
                  "false",
                  where);
        const Json& p = s.at("pattern");
        if (p.contains("Regex")) {
          step.regex.emplace(p["Regex"].get<std::string>(), where);
        } else {
          step.literal = p.at("String").get<std::string>();
        }
      } else {
        fail("[tokenizer] {}: pre_tokenizer type '{}' is not supported", where, type);
      }
      impl->steps.push_back(std::move(step));
    }
    MOE_CHECK(!steps.empty() && steps.back().value("type", std::string()) == "ByteLevel",
              "[tokenizer] {}: pre_tokenizer must end in ByteLevel (byte-level BPE only)", where);

    // Model.
    MOE_CHECK(doc.contains("model") && doc["model"].is_object(),
              "[tokenizer] {}: missing 'model' object", where);
    const Json& model = doc["model"];
    const std::string model_type = string_field(model, "type", std::string("BPE"), where);
    MOE_CHECK(model_type == "BPE", "[tokenizer] {}: model type '{}' is not BPE", where, model_type);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      MOE_CHECK(!model.contains(key) || model[key].is_null() || model[key] == "",
                "[tokenizer] {}: model.{} is not supported", where, key);
    }
    MOE_CHECK(!bool_field(model, "byte_fallback", false, where),
              "[tokenizer] {}: model.byte_fallback is not supported", where);
    MOE_CHECK(!model.contains("dropout") || model["dropout"].is_null() ||
                  (model["dropout"].is_number() && model["dropout"].get<double>() == 0.0),
              "[tokenizer] {}: model.dropout is not supported", where);
    impl->fuse_unk = bool_field(model, "fuse_unk", false, where);
    impl->ignore_merges = bool_field(model, "ignore_merges", false, where);
    MOE_CHECK(model.contains("vocab") && model["vocab"].is_object(),
              "[tokenizer] {}: model.vocab must be an object of token -> id", where);
    for (const auto& [token, value] : model["vocab"].items()) {
      MOE_CHECK(value.is_number_integer(), "[tokenizer] {}: vocab entry '{}' has a non-integer id",
                where, token);
      const int64_t id = value.get<int64_t>();
      MOE_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max(),
                "[tokenizer] {}: vocab entry '{}' has id {} out of range", where, token, id);
      impl->vocab[token] = static_cast<int32_t>(id);
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      const std::string unk = model["unk_token"].get<std::string>();
      auto it = impl->vocab.find(unk);
      MOE_CHECK(it != impl->vocab.end(), "[tokenizer] {}: unk_token '{}' is not in the vocab",
                where, unk);
      impl->unk_id = it->second;
    }
    const auto& chars = byte_level_chars();
    for (size_t b = 0; b < 256; ++b) {
      auto it = impl->vocab.find(chars[b]);
      if (it != impl->vocab.end()) impl->byte_id[b] = it->second;
    }
    MOE_CHECK(model.contains("merges") && model["merges"].is_array(),
              "[tokenizer] {}: model.merges must be a list", where);
    const Json& merges = model["merges"];
    impl->merges.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const Json& m = merges[rank];
      std::string a;
      std::string b;
      if (m.is_string()) {
        const std::string line = m.get<std::string>();
        const size_t space = line.find(' ');
        MOE_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                  "[tokenizer] {}: merge {} '{}' is not two tokens separated by one space", where,
                  rank, line);
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else {
        MOE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                  "[tokenizer] {}: merge {} is neither \"a b\" nor [a, b]", where, rank);
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      }
      const auto find = [&](const std::string& token) {
        auto it = impl->vocab.find(token);
        MOE_CHECK(it != impl->vocab.end(), "[tokenizer] {}: merge {} uses '{}', not in the vocab",
                  where, rank, token);
        return it->second;
      };
      const int32_t id_a = find(a);
      const int32_t id_b = find(b);
      const int32_t id_new = find(a + b);
      // Later duplicates win, as in tokenizers' HashMap collect.
      impl->merges[pair_key(id_a, id_b)] = {static_cast<int32_t>(rank), id_new};
    }

    // Added tokens.
    if (doc.contains("added_tokens") && !doc["added_tokens"].is_null()) {
      MOE_CHECK(doc["added_tokens"].is_array(), "[tokenizer] {}: added_tokens must be a list",
                where);
      for (const Json& t : doc["added_tokens"]) {
        AddedToken tok;
        MOE_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                      t.contains("content") && t["content"].is_string(),
                  "[tokenizer] {}: added token without integer id and string content", where);
        const int64_t id = t["id"].get<int64_t>();
        tok.content = t["content"].get<std::string>();
        MOE_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max() && !tok.content.empty(),
                  "[tokenizer] {}: added token '{}' has id {} out of range or empty content", where,
                  tok.content, id);
        tok.id = static_cast<int32_t>(id);
        tok.single_word = bool_field(t, "single_word", false, where);
        tok.lstrip = bool_field(t, "lstrip", false, where);
        tok.rstrip = bool_field(t, "rstrip", false, where);
        tok.special = bool_field(t, "special", false, where);
        // tokenizers' default (AddedToken::from): special tokens are matched before
        // normalization.
        tok.normalized = bool_field(t, "normalized", !tok.special, where);
        // NFC turns U+212A KELVIN SIGN into K: such a token matches the K of the normalized text.
        tok.pattern = impl->nfc && tok.normalized ? nfc_normalize(tok.content) : tok.content;
        impl->added_ids[tok.content] = tok.id;
        impl->added.push_back(std::move(tok));
      }
    }
  } catch (const Json::exception& e) {
    fail("[tokenizer] {}: malformed tokenizer.json: {}", where, one_line(e.what()));
  }
  impl->raw_added = AddedTokenMatcher(impl->added, false);
  impl->normalized_added = AddedTokenMatcher(impl->added, true);

  // Id tables. The ids must be dense and unique: 0 .. n-1, each naming one token (an added token
  // may repeat its own vocab entry, as Hugging Face files do). Checked against the number of
  // entries before anything is sized by an id: one id of 100,000,063 allocated gigabytes.
  int64_t max_id = -1;
  for (const auto& [token, id] : impl->vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& t : impl->added) max_id = std::max<int64_t>(max_id, t.id);
  const int64_t entries = static_cast<int64_t>(impl->vocab.size() + impl->added.size());
  MOE_CHECK(max_id < entries,
            "[tokenizer] {}: id {} with only {} vocab and added tokens: the ids must be dense "
            "(0 .. n-1)",
            where, max_id, entries);
  impl->size = max_id + 1;
  const auto n = static_cast<size_t>(impl->size);
  impl->id_token.assign(n, std::string());
  impl->id_present.assign(n, false);
  for (const auto& [token, id] : impl->vocab) {
    const auto slot = static_cast<size_t>(id);
    MOE_CHECK(!impl->id_present[slot],
              "[tokenizer] {}: id {} names both '{}' and '{}' in the vocab", where, id,
              impl->id_token[slot], token);
    impl->id_token[slot] = token;
    impl->id_present[slot] = true;
  }
  std::vector<bool> added_id(n, false);
  for (const AddedToken& t : impl->added) {
    const auto slot = static_cast<size_t>(t.id);
    MOE_CHECK(!added_id[slot], "[tokenizer] {}: added tokens '{}' and '{}' share id {}", where,
              impl->id_token[slot], t.content, t.id);
    MOE_CHECK(!impl->id_present[slot] || impl->id_token[slot] == t.content,
              "[tokenizer] {}: added token '{}' has id {}, which the vocab gives to '{}'", where,
              t.content, t.id, impl->id_token[slot]);
    added_id[slot] = true;
    impl->id_token[slot] = t.content;
    impl->id_present[slot] = true;
  }
  for (size_t id = 0; id < n; ++id)
    MOE_CHECK(impl->id_present[id],
              "[tokenizer] {}: no token has id {} (the ids must be dense: 0 .. {})", where, id,
              n - 1);
  // Byte-level BPE starts from one symbol per byte: a missing one would silently drop that byte
  // from the text (or turn it into unk), so all 256 are required.
  for (size_t b = 0; b < 256; ++b)
    MOE_CHECK(impl->byte_id[b] >= 0,
              "[tokenizer] {}: the byte-level vocabulary has no symbol '{}' for byte 0x{:02X} (a "
              "byte-level vocabulary holds all 256)",
              where, byte_level_chars()[b], b);
  // ByteLevel decoder, per token: the bytes its characters stand for, or its own UTF-8 text when
  // some character is not a byte-level character (e.g. a special token containing a space).
  impl->id_bytes.assign(n, std::string());
  for (size_t id = 0; id < n; ++id) {
    const std::string& token = impl->id_token[id];
    std::string bytes;
    bool all_mapped = true;
    for (size_t pos = 0; pos < token.size() && all_mapped;) {
      char32_t cp = 0;
      pos += utf8_next(token, pos, cp);
      const int b = byte_level_byte(cp);
      if (b < 0) {
        all_mapped = false;
      } else {
        bytes += static_cast<char>(b);
      }
    }
    impl->id_bytes[id] = all_mapped ? bytes : token;
  }
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"}) {
    if (impl->eos) break;
    for (const AddedToken& t : impl->added) {
      if (t.special && t.content == name) {
        impl->eos = t.id;
        break;
      }
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  // tokenizers takes a Rust &str: text that is not UTF-8 never reaches it.
  const size_t invalid = utf8_invalid_offset(text);
  MOE_CHECK(invalid == std::string_view::npos,
            "[tokenizer] the text to encode is not UTF-8 at byte {} (of {})", invalid, text.size());
  // tokenizers' AddedVocabulary::extract_and_normalize: the tokens matched before normalization
  // over the whole text, then the normalized ones inside each piece of text that pass left.
  std::vector<TextPiece> raw_pieces;
  im.raw_added.split(text, raw_pieces);
  std::deque<std::string> normalized_texts;
  std::vector<TextPiece> pieces;
  for (const TextPiece& piece : raw_pieces) {
    if (piece.token != nullptr) {
      pieces.push_back(piece);
      continue;
    }
    if (im.nfc && !is_ascii(piece.text)) {
      // The normalized text outlives the pieces that view it; a deque never moves its strings.
      normalized_texts.push_back(nfc_normalize(piece.text));
      im.normalized_added.split(normalized_texts.back(), pieces);
    } else {
      // NFC leaves ASCII text as it is.
      im.normalized_added.split(piece.text, pieces);
    }
  }
  StringMap<std::pair<uint32_t, uint32_t>> cache;
  std::vector<int32_t> pool;
  for (const TextPiece& piece : pieces) {
    if (piece.token != nullptr) {
      ids.push_back(piece.token->id);
    } else {
      im.encode_segment(piece.text, ids, cache, pool);
    }
  }
  return ids;
}

std::string Tokenizer::decode_text(const std::vector<int32_t>& ids) const {
  const std::string bytes = decode(ids);
  std::string text;
  text.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    char32_t cp = 0;
    size_t len = utf8_next(bytes, pos, cp);
    if (cp == 0xFFFFFFFF) {
      len = utf8_maximal_subpart(bytes, pos);
      text += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    } else {
      text.append(bytes, pos, len);
    }
    pos += len;
  }
  return text;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& im = *impl_;
  std::string out;
  for (int32_t id : ids) {
    MOE_CHECK(id >= 0 && id < im.size && im.id_present[static_cast<size_t>(id)],
              "[tokenizer] decode: id {} is not in the vocabulary of {} ids", id, im.size);
    out += im.id_bytes[static_cast<size_t>(id)];
  }
  return out;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->size;
}

std::optional<int32_t> Tokenizer::token_id(const std::string& token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->size || !impl_->id_present[static_cast<size_t>(id)]) {
    return std::nullopt;
  }
  return impl_->id_token[static_cast<size_t>(id)];
}

int32_t Tokenizer::eos_id() const {
  MOE_CHECK(impl_->eos.has_value(),
            "[tokenizer] {}: no EOS token (none of <|endoftext|>, <|end_of_text|>, </s>, <eos>, "
            "<|eos|> is a special added token)",
            impl_->origin);
  return *impl_->eos;
}

std::string Tokenizer::to_json() const {
  return impl_->json_text;
}

void Tokenizer::save(const std::string& path) const {
  const std::string& text = impl_->json_text;
  const std::span<const std::byte> chunk(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  io::write_file_atomic(path, std::span<const std::span<const std::byte>>(&chunk, 1),
                        "[tokenizer]");
}

}  // namespace moecore::data
