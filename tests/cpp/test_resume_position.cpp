// Where a resumed run's loader starts (train/training_data.h): the saved cursor, or under
// OLMo-core's order with another batch size or seq_len OLMo-core's load_state_dict rule. Checked
// against OLMo-core's own loader by tests/reference/test_olmo_core_data_order.py; here the cases
// its token files cannot reach (a new seq_len whose epoch ends before the tokens read in the
// saved one) and the arithmetic by hand.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "train/training_data.h"

namespace moecore {
namespace {

RunConfig olmo_core_run(int64_t batch_size, int64_t seq_len) {
  RunConfig config;
  config.data.order = data::OrderRule::kOlmoCore;
  config.train.seed = 3;
  config.train.batch_size = batch_size;
  config.train.seq_len = seq_len;
  return config;
}

TrainerState saved_at(uint64_t cursor, int64_t instances) {
  TrainerState state;
  state.data_cursor = cursor;
  state.train_data = data::DatasetFingerprint{.tokens = 1000, .instances = instances};
  return state;
}

TEST(ResumePosition, TheSavedCursorWhereNothingMoves) {
  const RunConfig saved = olmo_core_run(6, 16);
  // Same settings; moecore's order (its epochs are all instances); nothing read yet.
  EXPECT_FALSE(resume_position(saved, saved_at(42, 40), "ckpt", saved, 40).moved);
  RunConfig mine = olmo_core_run(4, 16), mine_saved = saved;
  mine.data.order = mine_saved.data.order = data::OrderRule::kMoecore;
  const ResumePosition kept = resume_position(mine_saved, saved_at(42, 40), "ckpt", mine, 40);
  EXPECT_FALSE(kept.moved);
  EXPECT_EQ(kept.cursor, 42u);
  EXPECT_EQ(resume_position(saved, saved_at(0, 40), "ckpt", olmo_core_run(4, 16), 40).cursor, 0u);
}

TEST(ResumePosition, ASmallerBatchRestartsTheEpochAtItsWholeBatches) {
  // 40 instances in batches of 6: epochs of 36. Cursor 42 is 6 instances into the second epoch;
  // in batches of 4 (epochs of 40) those fill one batch, and 2 instances are read again.
  const ResumePosition p =
      resume_position(olmo_core_run(6, 16), saved_at(42, 40), "ckpt", olmo_core_run(4, 16), 40);
  EXPECT_TRUE(p.moved);
  EXPECT_EQ(p.epoch, 2u);
  EXPECT_EQ(p.offset, 4);
  EXPECT_EQ(p.epoch_length, 40);
  EXPECT_EQ(p.tokens_read, 6 * 16);
  EXPECT_EQ(p.read_again, 2);
  EXPECT_EQ(p.cursor, 40u + 4u);
}

TEST(ResumePosition, AtAnEpochsEndTheEndedEpochGoesOn) {
  // Cursor 36 ended the first epoch of batches of 6; in batches of 4 that epoch has 40 instances,
  // and OLMo-core (which checkpoints before it resets the epoch) reads its last batch first.
  const ResumePosition p =
      resume_position(olmo_core_run(6, 16), saved_at(36, 40), "ckpt", olmo_core_run(4, 16), 40);
  EXPECT_EQ(p.epoch, 1u);
  EXPECT_EQ(p.offset, 36);
  EXPECT_EQ(p.cursor, 36u);
  EXPECT_EQ(p.read_again, 0);
}

TEST(ResumePosition, PastTheNewEpochsLastBatchTheNextEpochStarts) {
  // The saved run read its whole first epoch (40 instances of 16 tokens); the same tokens cut
  // into 32-token instances, file by file, give 15 (epochs of 14 in batches of 2): 640 tokens
  // would fill 10 batches, the epoch has 7, so its loader yields nothing and epoch 2 starts.
  const ResumePosition p =
      resume_position(olmo_core_run(4, 16), saved_at(40, 40), "ckpt", olmo_core_run(2, 32), 15);
  EXPECT_EQ(p.epoch, 1u);
  EXPECT_EQ(p.offset, 14);
  EXPECT_EQ(p.epoch_length, 14);
  EXPECT_EQ(p.cursor, 14u);    // the start of the second epoch
  EXPECT_EQ(p.read_again, 0);  // other instances: none is "the same"
}

TEST(ResumePosition, AnotherSeqLenNeedsTheSavedInstanceCount) {
  TrainerState older = saved_at(42, 40);
  older.train_data.reset();
  try {
    resume_position(olmo_core_run(6, 16), older, "run/step_7", olmo_core_run(6, 32), 20);
    FAIL() << "an older checkpoint's position was guessed";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("run/step_7"), std::string::npos) << message;
    EXPECT_NE(message.find("train.seq_len=16"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // The same seq_len needs no count: the instances are this run's.
  EXPECT_EQ(resume_position(olmo_core_run(6, 16), older, "ckpt", olmo_core_run(4, 16), 40).cursor,
            44u);
}

TEST(ResumePosition, AReplayOriginsEpochMustHoldItsCursor) {
  // Epochs of 36 (40 instances, batches of 6): cursor 40 is in the second epoch, or at the end of
  // none; epoch 1 (the first) cannot hold it, nor can epoch 3.
  TrainerState state = saved_at(46, 40);
  state.origin = {.step = 6, .data_cursor = 40, .tokens_seen = 640, .epoch = 2, .epoch_tokens = 64};
  EXPECT_NO_THROW(resume_position(olmo_core_run(6, 16), state, "ckpt", olmo_core_run(4, 16), 40));
  for (const uint64_t epoch : {1u, 3u}) {
    state.origin.epoch = epoch;
    try {
      resume_position(olmo_core_run(6, 16), state, "run/step_7", olmo_core_run(4, 16), 40);
      FAIL() << "epoch " << epoch << " was trusted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("run/step_7: replay_origin.epoch="), std::string::npos)
          << e.what();
    }
  }
  // At an epoch's end the origin may name the epoch that ended.
  state.origin.data_cursor = 36;
  state.origin.epoch = 1;
  state.data_cursor = 36 + 6;
  EXPECT_NO_THROW(resume_position(olmo_core_run(6, 16), state, "ckpt", olmo_core_run(4, 16), 40));
}

}  // namespace
}  // namespace moecore
