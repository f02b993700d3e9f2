// Byte-level BPE tokenizer compatible with Hugging Face `tokenizers` (GPT-2 / OLMo style
// tokenizer.json): added tokens are split out first as tokenizers' AddedVocabulary does (those
// with normalized=false over the whole text, then the normalized ones inside what is left;
// leftmost-longest; single_word, lstrip, rstrip), the rest is pre-tokenized (ByteLevel with the
// GPT-2 regex, or a Sequence of Split regexes + ByteLevel), each piece's bytes are mapped through
// GPT-2's bytes_to_unicode and merged by rank exactly as tokenizers' BPE model does. encode()
// equals `tokenizer.encode(text, add_special_tokens=False).ids`.
//
// Supported tokenizer.json: model BPE (vocab, merges as "a b" strings or [a, b] pairs,
// ignore_merges, unk_token/fuse_unk); no continuing_subword_prefix / end_of_word_suffix /
// byte_fallback / dropout. normalizer null, NFC or a Sequence of NFC (utf8proc's NFC; normalized
// added tokens are matched in their NFC form, as tokenizers does). pre_tokenizer ByteLevel, or
// Sequence of Split (Regex or String pattern, Isolated, not inverted) and ByteLevel. The
// post-processor is ignored (encode adds no special tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moecore::data {

class Tokenizer {
 public:
  // Reads a tokenizer.json. Errors are one line and name the file.
  static Tokenizer load(const std::string& path);
  // Same from JSON text; `origin` names the source in errors.
  static Tokenizer from_json(std::string_view json_text, const std::string& origin = "<memory>");

  // Thread-safe; caches BPE results per pre-token within one call. Text that is not valid UTF-8
  // is an error naming the offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // Concatenates the tokens' bytes (ByteLevel decoder; special tokens included verbatim). Returns
  // raw bytes: a cut inside a multi-byte character is not replaced by U+FFFD as Python does.
  std::string decode(const std::vector<int32_t>& ids) const;
  // decode() made printable: every byte that is not part of a valid UTF-8 character becomes
  // U+FFFD (text shown to people; sampled tokens can end inside a character).
  std::string decode_text(const std::vector<int32_t>& ids) const;

  // 1 + the largest id of the vocab and the added tokens (the embedding size the ids need).
  int64_t vocab_size() const;
  // The id of an added token's content, else of a vocab entry (byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_id(const std::string& token) const;
  // The vocab or added-token string of an id.
  std::optional<std::string> id_to_token(int32_t id) const;
  // The EOS id: the special token <|endoftext|>, else <|end_of_text|>, </s>, <eos>, <|eos|>
  // (first present). Throws when none is.
  int32_t eos_id() const;

  // The tokenizer.json text: the loaded document as read, or the full structure for a trained one.
  std::string to_json() const;
  // Writes to_json() atomically.
  void save(const std::string& path) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moecore::data
