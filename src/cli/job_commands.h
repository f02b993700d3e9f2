// The user's day with moecore: tokenizer training, corpus preparation, training, evaluation and
// generation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::cli {

void run_tokenizer_train(const std::vector<std::string>& inputs, int64_t vocab_size,
                         const std::string& out);
void run_tokenizer_encode(const std::string& tokenizer, const std::string& input,
                          const std::string& out);
void run_prepare(const std::string& tokenizer, const std::vector<std::string>& inputs,
                 const std::string& out, double val_fraction, bool overwrite);
void run_eval(const std::string& checkpoint, const std::vector<std::string>& data,
              int64_t max_instances);

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer;
  int64_t max_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};
void run_generate(const GenerateArgs& args);

}  // namespace moecore::cli
