#include "data/bpe_trainer.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "data/bpe_pair.h"
#include "data/tokenizer_byte_level.h"
#include "io/file_util.h"

namespace moecore::data {
namespace {

// A queued candidate merge: its count when queued, and the words to apply it to.
struct QueueEntry {
  int64_t count;
  uint64_t pair;
  uint32_t positions;  // index into the position lists
  // Max-heap order: highest count, then the smallest (left id, right id).
  bool operator<(const QueueEntry& o) const {
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

// tokenizers' Word::merge: replaces every (c1, c2) left to right in place and reports the pair
// count changes (+1 / -1 per occurrence) it causes in this word.
void merge_word(std::vector<int32_t>& s, int32_t c1, int32_t c2, int32_t replacement,
                std::vector<std::pair<uint64_t, int32_t>>& changes) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != c1 || i + 1 >= s.size() || s[i + 1] != c2) continue;
    const int32_t first = s[i];
    const int32_t second = s[i + 1];
    if (i > 0) {
      changes.emplace_back(pair_key(s[i - 1], first), -1);
      changes.emplace_back(pair_key(s[i - 1], replacement), 1);
    }
    s[i] = replacement;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    if (i + 1 < s.size()) {
      changes.emplace_back(pair_key(second, s[i + 1]), -1);
      changes.emplace_back(pair_key(replacement, s[i + 1]), 1);
    }
  }
}

Tokenizer train(const std::vector<std::string_view>& texts, int64_t vocab_size,
                const std::vector<std::string>& special_tokens) {
  MOE_CHECK(vocab_size >= static_cast<int64_t>(special_tokens.size()) + 256 &&
                vocab_size <= std::numeric_limits<int32_t>::max(),
            "[tokenizer] vocab_size={} must be at least 256 byte symbols + {} special tokens and "
            "fit in int32",
            vocab_size, special_tokens.size());
  for (const std::string& s : special_tokens) {
    MOE_CHECK(!s.empty() && utf8_valid(s), "[tokenizer] special token '{}' is empty or not UTF-8",
              s);
  }

  // Count the pre-tokenized words, one line (with its "\n") at a time.
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> word_counts;
  const RegexSplitter splitter(kGpt2SplitPattern, "train");
  std::vector<std::string_view> pieces;
  for (std::string_view text : texts) {
    size_t start = 0;
    while (start < text.size()) {
      const size_t nl = text.find('\n', start);
      const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
      pieces.clear();
      splitter.split(text.substr(start, end - start), pieces);
      for (std::string_view p : pieces) {
        auto it = word_counts.find(p);
        if (it == word_counts.end()) {
          word_counts.emplace(std::string(p), 1);
        } else {
          ++it->second;
        }
      }
      start = end;
    }
  }

  // Ids: special tokens, then the byte alphabet by code point.
  std::vector<std::string> id_to_word;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> word_to_id;
  const auto add_word = [&](const std::string& w) {
    auto it = word_to_id.find(w);
    if (it != word_to_id.end()) return it->second;
    const auto id = static_cast<int32_t>(id_to_word.size());
    id_to_word.push_back(w);
    word_to_id.emplace(w, id);
    return id;
  };
  for (const std::string& s : special_tokens) add_word(s);
  std::vector<int> bytes_by_code_point(256);
  for (int b = 0; b < 256; ++b) bytes_by_code_point[static_cast<size_t>(b)] = b;
  std::sort(bytes_by_code_point.begin(), bytes_by_code_point.end(), [](int x, int y) {
    return byte_level_code_point(static_cast<uint8_t>(x)) <
           byte_level_code_point(static_cast<uint8_t>(y));
  });
  std::array<int32_t, 256> byte_id{};
  for (int b : bytes_by_code_point) {
    byte_id[static_cast<size_t>(b)] = add_word(byte_level_chars()[static_cast<size_t>(b)]);
  }

  // Words in a fixed (sorted) order so that the position lists are deterministic.
  std::vector<std::pair<std::string, int64_t>> sorted_words(word_counts.begin(), word_counts.end());
  word_counts.clear();
  std::sort(sorted_words.begin(), sorted_words.end());
  std::vector<std::vector<int32_t>> words(sorted_words.size());
  std::vector<int64_t> counts(sorted_words.size());
  for (size_t i = 0; i < sorted_words.size(); ++i) {
    for (char c : sorted_words[i].first) words[i].push_back(byte_id[static_cast<uint8_t>(c)]);
    counts[i] = sorted_words[i].second;
  }
  sorted_words.clear();

  std::unordered_map<uint64_t, int64_t, PairHash> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>, PairHash> where;
  const auto note_position = [&](uint64_t pair, int32_t word) {
    std::vector<int32_t>& list = where[pair];
    if (list.empty() || list.back() != word) list.push_back(word);
  };
  for (size_t i = 0; i < words.size(); ++i) {
    const std::vector<int32_t>& w = words[i];
    for (size_t k = 0; k + 1 < w.size(); ++k) {
      const uint64_t pair = pair_key(w[k], w[k + 1]);
      pair_counts[pair] += counts[i];
      note_position(pair, static_cast<int32_t>(i));
    }
  }

  std::vector<std::vector<int32_t>> positions;
  std::priority_queue<QueueEntry> queue;
  const auto enqueue_where = [&] {
    std::vector<uint64_t> pairs;
    pairs.reserve(where.size());
    for (const auto& [pair, list] : where) pairs.push_back(pair);
    std::sort(pairs.begin(), pairs.end());
    for (uint64_t pair : pairs) {
      const int64_t count = pair_counts[pair];
      if (count > 0) {
        positions.push_back(std::move(where[pair]));
        queue.push({count, pair, static_cast<uint32_t>(positions.size() - 1)});
      }
    }
    where.clear();
  };
  enqueue_where();

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<std::pair<uint64_t, int32_t>> changes;
  while (static_cast<int64_t>(id_to_word.size()) < vocab_size && !queue.empty()) {
    QueueEntry top = queue.top();
    queue.pop();
    const int64_t current = pair_counts[top.pair];
    if (top.count != current) {
      top.count = current;
      queue.push(top);
      continue;
    }
    if (top.count < 1) break;
    const int32_t a = pair_left(top.pair);
    const int32_t b = pair_right(top.pair);
    const int32_t new_id =
        add_word(id_to_word[static_cast<size_t>(a)] + id_to_word[static_cast<size_t>(b)]);
    merges.emplace_back(a, b);
    std::vector<int32_t> list = std::move(positions[top.positions]);
    positions[top.positions] = {};
    for (int32_t word : list) {
      changes.clear();
      merge_word(words[static_cast<size_t>(word)], a, b, new_id, changes);
      for (const auto& [pair, delta] : changes) {
        pair_counts[pair] += delta * counts[static_cast<size_t>(word)];
        if (delta > 0) note_position(pair, word);
      }
    }
    enqueue_where();
  }

  // tokenizer.json in the layout tokenizers writes.
  using OJson = nlohmann::ordered_json;
  OJson doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  OJson added = OJson::array();
  for (const std::string& s : special_tokens) {
    added.push_back({{"id", word_to_id.at(s)},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  doc["added_tokens"] = added;
  doc["normalizer"] = nullptr;
  // The sections of tokenizers' own ByteLevelBPETokenizer (add_prefix_space and trim_offsets
  // false): a post-processor that leaves the offsets as the pre-tokenizer made them, a decoder
  // with ByteLevel's defaults.
  const auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return OJson{{"type", "ByteLevel"},
                 {"add_prefix_space", add_prefix_space},
                 {"trim_offsets", trim_offsets},
                 {"use_regex", true}};
  };
  doc["pre_tokenizer"] = byte_level(false, true);
  doc["post_processor"] = byte_level(true, false);
  doc["decoder"] = byte_level(true, true);
  OJson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  OJson vocab = OJson::object();
  for (size_t id = 0; id < id_to_word.size(); ++id) vocab[id_to_word[id]] = id;
  model["vocab"] = std::move(vocab);
  OJson merge_list = OJson::array();
  for (const auto& [x, y] : merges) {
    merge_list.push_back({id_to_word[static_cast<size_t>(x)], id_to_word[static_cast<size_t>(y)]});
  }
  model["merges"] = std::move(merge_list);
  doc["model"] = std::move(model);
  return Tokenizer::from_json(doc.dump(2), "<trained>");
}

}  // namespace

Tokenizer train_bpe(const std::vector<std::string>& files, int64_t vocab_size,
                    const std::vector<std::string>& special_tokens) {
  MOE_CHECK(!files.empty(), "[tokenizer] train: no input files");
  std::vector<io::MappedFile> maps;
  std::vector<std::string_view> texts;
  for (const std::string& path : files) {
    maps.push_back(io::MappedFile::open(path, "[tokenizer]"));
    texts.emplace_back(reinterpret_cast<const char*>(maps.back().data()), maps.back().size());
    // tokenizers trains on Python strings: a file that is not UTF-8 is refused, not split as bytes.
    const size_t invalid = utf8_invalid_offset(texts.back());
    MOE_CHECK(invalid == std::string_view::npos,
              "[tokenizer] {}: not UTF-8 at byte {} (the input must be UTF-8 text)", path, invalid);
  }
  return train(texts, vocab_size, special_tokens);
}

Tokenizer train_bpe_from_texts(const std::vector<std::string>& texts, int64_t vocab_size,
                               const std::vector<std::string>& special_tokens) {
  return train(std::vector<std::string_view>(texts.begin(), texts.end()), vocab_size,
               special_tokens);
}

}  // namespace moecore::data
