#include "data/byte_corpus.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include "core/check.h"

namespace moecore::data {

ByteCorpus ByteCorpus::load(const std::string& path, double val_fraction, int64_t seq_len) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[data] cannot open corpus '{}'", path);
  MOE_CHECK(val_fraction > 0.0 && val_fraction < 1.0,
            "[data] data.val_fraction={} must be in (0, 1)", val_fraction);
  ByteCorpus corpus;
  corpus.bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  corpus.seq_len_ = seq_len;
  const int64_t size = static_cast<int64_t>(corpus.bytes_.size());
  corpus.split_ = static_cast<int64_t>(static_cast<double>(size) * (1.0 - val_fraction));
  MOE_CHECK(corpus.split_ > seq_len + 1 && size - corpus.split_ > seq_len + 1,
            "[data] corpus '{}' has {} bytes: too small for seq_len={} with val_fraction={}", path,
            size, seq_len, val_fraction);
  return corpus;
}

void ByteCorpus::window(int64_t start, int32_t* tokens, int32_t* targets) const {
  for (int64_t t = 0; t < seq_len_; ++t) {
    tokens[t] = bytes_[static_cast<size_t>(start + t)];
    targets[t] = bytes_[static_cast<size_t>(start + t + 1)];
  }
}

void ByteCorpus::sample_train(std::mt19937_64& rng, int64_t batch, std::vector<int32_t>& tokens,
                              std::vector<int32_t>& targets) const {
  tokens.resize(static_cast<size_t>(batch * seq_len_));
  targets.resize(tokens.size());
  std::uniform_int_distribution<int64_t> start(0, split_ - seq_len_ - 1);
  for (int64_t b = 0; b < batch; ++b)
    window(start(rng), tokens.data() + b * seq_len_, targets.data() + b * seq_len_);
}

void ByteCorpus::val_window(int64_t index, int64_t count, std::vector<int32_t>& tokens,
                            std::vector<int32_t>& targets) const {
  tokens.resize(static_cast<size_t>(seq_len_));
  targets.resize(tokens.size());
  const int64_t span = val_bytes() - seq_len_ - 1;
  window(split_ + span * index / std::max<int64_t>(1, count), tokens.data(), targets.data());
}

}  // namespace moecore::data
