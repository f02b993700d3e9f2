// The sequence-length warm-up (train/seq_len_warmup.h), OLMo-core's
// SequenceLengthSchedulerCallback. Whole runs against OLMo-core's own callback functions and train
// module split are tests/reference/test_olmo_core_training_run.py; here the lengths (the expected
// values are OLMo-core 3.0.0's _get_split_sequence_length and _get_truncated_sequence_length,
// evaluated once), the micro-batch splits, the cut and the settings' checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "core/ignore_index.h"
#include "train/run_config.h"
#include "train/seq_len_warmup.h"

namespace moecore {
namespace {

TrainConfig warmup(int64_t seq_len, int64_t min, int64_t steps, bool truncate = false,
                   int64_t multiple = 128) {
  TrainConfig t;
  t.seq_len = seq_len;
  t.seq_len_warmup_min = min;
  t.seq_len_warmup_steps = steps;
  t.seq_len_warmup_truncate = truncate;
  t.seq_len_warmup_multiple = multiple;
  return t;
}

std::vector<int64_t> lengths(const TrainConfig& t, const std::vector<int64_t>& steps) {
  std::vector<int64_t> out;
  for (const int64_t step : steps) out.push_back(warmup_seq_len(t, step));
  return out;
}

TEST(SeqLenWarmup, LengthsAreOlmoCores) {
  const std::vector<int64_t> steps{1, 100, 134, 135, 500, 1000, 1999, 2000, 2001};
  EXPECT_EQ(lengths(warmup(2048, 128, 2000), steps),
            (std::vector<int64_t>{128, 128, 256, 256, 512, 1024, 1024, 2048, 2048}));
  EXPECT_EQ(lengths(warmup(2048, 128, 2000, true, 128), steps),
            (std::vector<int64_t>{128, 128, 256, 256, 512, 1024, 1920, 2048, 2048}));
  EXPECT_EQ(lengths(warmup(1000, 100, 7, true, 64), {1, 2, 3, 4, 5, 6, 7}),
            (std::vector<int64_t>{192, 320, 448, 576, 704, 832, 960}));
  EXPECT_EQ(warmup_seq_len(warmup(2048, 128, 0), 1), 2048);  // no warm-up
}

TEST(SeqLenWarmup, MicroBatchesAreSplitAsOlmoCoresTrainModuleSplitsThem) {
  // 2 micro-batches of 2 instances of 12 a rank, melted into 4 rows of 3: OLMo-core's callback
  // quadruples the micro-batch's tokens (96), 32 rows of 3, more than the 16 the batch has.
  const TrainConfig melt = warmup(12, 3, 4);
  WarmupShape s = warmup_shape(melt, 2, 2, 1);
  EXPECT_TRUE(s.cut);
  EXPECT_EQ(s.seq, 3);
  EXPECT_EQ(s.pieces, 4);
  EXPECT_EQ(s.micro, 1);
  EXPECT_EQ(s.rows, 16);
  s = warmup_shape(melt, 4, 2, 2);  // 2 rows of 6 an instance; micro-batches of 2 x 2 x 2 rows
  EXPECT_EQ(s.seq, 6);
  EXPECT_EQ(s.micro, 2);
  EXPECT_EQ(s.rows, 8);
  s = warmup_shape(melt, 4, 2, 5);  // past the warm-up: the batch as it is
  EXPECT_FALSE(s.cut);
  EXPECT_EQ(s.micro, 4);
  EXPECT_EQ(s.rows, 2);
  // Truncated to 8 of 12: micro-batches of 24 // 8 = 3 of a rank's 4 instances leave one of 1.
  TrainConfig truncate = warmup(12, 4, 4, true, 2);
  truncate.batch_size = 4;  // 2 micro-batches of 2
  truncate.microbatches = 2;
  try {
    (void)warmup_shape(truncate, 2, 2, 2);
    ADD_FAILURE() << "an uneven split was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("micro-batches of 3 rows, the last of 1"), std::string::npos) << message;
  }
  EXPECT_THROW(check_warmup_shapes(truncate, 1), Error);
  TrainConfig fives = warmup(12, 5, 4, true, 5);  // 5, 5, 10: one, one, two micro-batches
  fives.batch_size = 4;
  fives.microbatches = 2;
  EXPECT_EQ(check_warmup_shapes(fives, 1), (std::vector<int64_t>{1, 2}));
  // A multiple above the minimum is fine (update 1: 128 x (325 // 128) = 256) until it truncates
  // an update to nothing (100 + 900 / 40 = 122.5: 0).
  EXPECT_EQ(warmup_seq_len(warmup(1000, 100, 4, true, 128), 1), 256);
  TrainConfig nothing = warmup(1000, 100, 40, true, 128);
  try {
    (void)check_warmup_shapes(nothing, 1);
    ADD_FAILURE() << "a truncation to 0 tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncates its instances to 0 tokens"), std::string::npos)
        << e.what();
  }
}

TEST(SeqLenWarmup, CutRowsEndInAnIgnoredTarget) {
  std::vector<int32_t> tokens(12), targets(12);
  for (int32_t i = 0; i < 12; ++i) tokens[i] = i;
  for (int32_t i = 0; i < 11; ++i) targets[i] = i + 1;
  targets[11] = kIgnoreIndex;
  const WarmupShape melt{3, 4, 1, 4, true};
  std::vector<int32_t> out_tokens(12), out_targets(12);
  cut_for_warmup(melt, 12, tokens.data(), targets.data(), 1, out_tokens.data(), out_targets.data());
  EXPECT_EQ(out_tokens, tokens);  // the same tokens, four rows of three
  const int32_t x = kIgnoreIndex;
  EXPECT_EQ(out_targets, (std::vector<int32_t>{1, 2, x, 4, 5, x, 7, 8, x, 10, 11, x}));
  const WarmupShape truncate{5, 1, 1, 1, true};
  std::vector<int32_t> first_tokens(5), first_targets(5);
  cut_for_warmup(truncate, 12, tokens.data(), targets.data(), 1, first_tokens.data(),
                 first_targets.data());
  EXPECT_EQ(first_tokens, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(first_targets, (std::vector<int32_t>{1, 2, 3, 4, x}));
}

TEST(SeqLenWarmup, BadSettingsAreOneLineErrors) {
  auto error_of = [](const std::string& train) {
    try {
      (void)parse_run_config("[train]\nseq_len = 12\n" + train, "c.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const auto& [train, needle] : std::vector<std::pair<std::string, std::string>>{
           {"seq_len_warmup_steps = -1\n", "must be >= 0"},
           {"seq_len_warmup_steps = 4\nseq_len_warmup_min = 12\n",
            "must be in [1, train.seq_len=12)"},
           {"seq_len_warmup_steps = 4\nseq_len_warmup_min = 5\n", "x a power of 2"},
           {"seq_len_warmup_steps = 4\nseq_len_warmup_min = 4\nseq_len_warmup_truncate = true\n"
            "seq_len_warmup_multiple = 0\n",
            "train.seq_len_warmup_multiple=0 must be >= 1"},
           {"seq_len_warmup_steps = 2000000000\nseq_len_warmup_min = 3\n", "at most 2^30"},
           {"seq_len_warmup_steps = 4\nseq_len_warmup_min = 3\n[data]\ndocument_masking = true\n",
            "cannot cut its document lengths"}}) {
    const std::string message = error_of(train);
    EXPECT_NE(message.find(needle), std::string::npos) << train << " -> " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(error_of("seq_len_warmup_steps = 4\nseq_len_warmup_min = 3\n"), "");
}

}  // namespace
}  // namespace moecore
