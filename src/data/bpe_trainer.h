// Byte-level BPE training, merge for merge the algorithm of Hugging Face tokenizers' BpeTrainer
// (trainers.BpeTrainer(vocab_size=N, special_tokens=S,
// initial_alphabet=pre_tokenizers.ByteLevel.alphabet()) behind a ByteLevel pre-tokenizer), so that
// both produce the same vocab and merges on the same files.
//
// - Files are read line by line, each line keeping its "\n" (tokenizers' train_from_files); each
//   line is split with the GPT-2 regex and the pieces are counted as words.
// - Ids: the special tokens first (0..S-1, in the given order), then the 256 byte symbols ordered
// by
//   the code point of their bytes_to_unicode character ('!' .. '~', '¡' .. '¬', '®' .. 'ÿ', then
//   'Ā' = byte 0, ...), then one id per merge in the order the merges are made.
// - Each step merges the pair with the highest count over all words (count weighted by word
//   frequency). Ties: the pair (left id, right id) that is smallest, compared as a pair of ids
//   (left id first) — tokenizers' rule, which with the id order above is deterministic.
// - Pair counts are updated incrementally: an index from pair to the words containing it, and a
//   max-heap of (count, pair) whose stale entries are re-queued with their current count when
//   popped.
// - Training stops at vocab_size ids (special tokens included) or when no pair is left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace moecore::data {

Tokenizer train_bpe(const std::vector<std::string>& files, int64_t vocab_size,
                    const std::vector<std::string>& special_tokens);

// The same from in-memory texts, each read like one file.
Tokenizer train_bpe_from_texts(const std::vector<std::string>& texts, int64_t vocab_size,
                               const std::vector<std::string>& special_tokens);

}  // namespace moecore::data
