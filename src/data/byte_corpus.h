// A text file as byte-level tokens (ids 0..255), split into a training part and a validation tail.
// Batches are random windows of seq_len + 1 bytes: tokens are the first seq_len, targets the last.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace moecore::data {

class ByteCorpus {
 public:
  static ByteCorpus load(const std::string& path, double val_fraction, int64_t seq_len);

  // Fills tokens/targets [batch, seq_len] with random windows from the training part.
  void sample_train(std::mt19937_64& rng, int64_t batch, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) const;
  // Window `index` of `count` evenly spaced windows over the validation part (deterministic).
  void val_window(int64_t index, int64_t count, std::vector<int32_t>& tokens,
                  std::vector<int32_t>& targets) const;

  int64_t train_bytes() const { return split_; }
  int64_t val_bytes() const { return static_cast<int64_t>(bytes_.size()) - split_; }

 private:
  void window(int64_t start, int32_t* tokens, int32_t* targets) const;

  std::vector<uint8_t> bytes_;
  int64_t split_ = 0;
  int64_t seq_len_ = 0;
};

}  // namespace moecore::data
