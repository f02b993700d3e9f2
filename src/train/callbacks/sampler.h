// The end-of-run sample: once a run that was not stopped by a signal is complete and saved, rank
// 0 reads the whole model back from the final checkpoint (whatever the layout) and prints a text
// sample from train.sample_prompt (train/sample.h).
#pragma once

#include <string>

#include "data/tokenizer.h"
#include "train/callback.h"

namespace moecore {

class SampleCallback final : public Callback {
 public:
  explicit SampleCallback(const data::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void on_checkpoint(TrainContext& ctx, int64_t step, const std::string& dir) override;
  void on_end(TrainContext& ctx) override;

 private:
  const data::Tokenizer& tokenizer_;
  std::string last_checkpoint_;  // rank 0
};

}  // namespace moecore
