// train.batch_sizes (train/batch_size_schedule.h): OLMo-core's BatchSizeSchedulerCallback. The
// whole runs against OLMo-core's own callback, loader and schedulers are
// tests/reference/test_olmo_core_batch_size_schedule.py; here the pieces: which size a start
// names, the initial_lr a history gives, the batch in force, what trainer_state.json records of
// it, and which rates move with initial_lr.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "optim/lr_schedule.h"
#include "train/batch_size_schedule.h"
#include "train/run_config.h"
#include "train/trainer_state.h"

namespace moecore {
namespace {

TrainConfig scheduled(BatchSizeUnits units) {
  TrainConfig t;
  t.batch_size = 4;
  t.microbatches = 2;
  t.seq_len = 16;
  t.batch_sizes = {4, 8, 2};
  t.batch_size_starts = {0, 10, 30};
  t.batch_size_units = units;
  return t;
}

TEST(BatchSizeSchedule, TheLatestStartReachedNamesTheSize) {
  const TrainConfig steps = scheduled(BatchSizeUnits::kSteps);
  EXPECT_EQ(scheduled_batch_size(steps, 0, 0), 4);
  EXPECT_EQ(scheduled_batch_size(steps, 9, 1 << 20), 4);  // tokens do not count here
  EXPECT_EQ(scheduled_batch_size(steps, 10, 0), 8);       // OLMo-core's due: step >= start
  EXPECT_EQ(scheduled_batch_size(steps, 30, 0), 2);
  EXPECT_EQ(scheduled_batch_size(steps, 1000, 0), 2);
  const TrainConfig tokens = scheduled(BatchSizeUnits::kTokens);
  EXPECT_EQ(scheduled_batch_size(tokens, 100, 9), 4);
  EXPECT_EQ(scheduled_batch_size(tokens, 0, 10), 8);
  EXPECT_EQ(scheduled_batch_size(tokens, 0, 29), 8);
  EXPECT_EQ(scheduled_batch_size(tokens, 0, 31), 2);
  // In epochs: due once the trainer's epoch (from 1) is past the start.
  TrainConfig epochs = scheduled(BatchSizeUnits::kEpochs);
  epochs.batch_size_starts = {0, 1, 2};
  EXPECT_EQ(scheduled_batch_size(epochs, 1000, 1 << 20, 1), 4);
  EXPECT_EQ(scheduled_batch_size(epochs, 0, 0, 2), 8);
  EXPECT_EQ(scheduled_batch_size(epochs, 0, 0, 3), 2);
  TrainConfig none;
  none.batch_size = 6;
  EXPECT_EQ(scheduled_batch_size(none, 123, 456), 6);
}

TEST(BatchSizeSchedule, EachChangeMultipliesInitialLrBySqrtOfItsFactorInOrder) {
  const double lr = 3e-4;
  const std::vector<int64_t> one{4};
  EXPECT_EQ(scheduled_initial_lr(lr, one), lr);
  // OLMo-core's callback: group["initial_lr"] *= sqrt(new / old) at each change, in order, so
  // 4 -> 8 -> 16 is lr x sqrt(2) x sqrt(2), not lr x 2 (one ulp apart here).
  const std::vector<int64_t> up{4, 8, 16};
  EXPECT_EQ(scheduled_initial_lr(lr, up), lr * std::sqrt(2.0) * std::sqrt(2.0));
  EXPECT_NE(scheduled_initial_lr(lr, up), lr * 2.0);
  const std::vector<int64_t> down_up{8, 2, 16};
  EXPECT_EQ(scheduled_initial_lr(lr, down_up), lr * std::sqrt(0.25) * std::sqrt(8.0));
}

TEST(BatchSizeSchedule, TheBatchInForceKeepsTheMicroBatch) {
  RunConfig c;
  c.train = scheduled(BatchSizeUnits::kSteps);
  const RunConfig eight = with_batch_size(c, 8);
  EXPECT_EQ(eight.train.batch_size, 8);
  EXPECT_EQ(eight.train.microbatches, 4);  // 2 sequences each, as before
  EXPECT_EQ(eight.train.batch_sizes, c.train.batch_sizes);
  EXPECT_EQ(with_batch_size(c, 2).train.microbatches, 1);
  EXPECT_THROW(with_batch_size(c, 3), Error);
}

TEST(BatchSizeSchedule, ChangesUnderMoecoresOrderAreMadeWhenDueAndRecountTheLength) {
  RunConfig c;
  c.train = scheduled(BatchSizeUnits::kSteps);
  c.train.max_tokens = 10000;
  c.train.max_steps = max_steps_for_tokens(c.train);
  c.optim.schedule = LrSchedule::kConstant;
  const std::vector<int64_t> history{4};
  EXPECT_FALSE(scheduled_batch_change(c, 9, {}, history, nullptr).has_value());
  // Step 10: 10 x 4 x 16 = 640 tokens seen, 40 instances read; moecore's order reads on.
  const std::optional<BatchSizeChange> change = scheduled_batch_change(c, 10, {}, history, nullptr);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->from, 4);
  EXPECT_EQ(change->to, 8);
  EXPECT_EQ(change->position.cursor, 40u);
  EXPECT_EQ(change->origin, (ReplayOrigin{10, 40, 640, 0, 0}));
  // OLMo-core's max_steps: 10 + ceil((10000 - 640) / (8 x 16)) = 10 + 74.
  EXPECT_EQ(change->config.train.max_steps, 84);
  EXPECT_EQ(change->config.train.batch_size, 8);
}

TEST(BatchSizeSchedule, AResumeGoesOnWithTheCheckpointsBatchUnlessItsKeysChange) {
  RunConfig saved;
  saved.train = scheduled(BatchSizeUnits::kSteps);
  TrainerState state;
  state.batch_size_history = {4, 8};
  ResumedBatch same = resumed_batch(saved, state, saved);
  EXPECT_EQ(same.history, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(same.in_force.train.batch_size, 8);
  EXPECT_EQ(same.saved_in_force.train.microbatches, 4);
  RunConfig moved = saved;
  moved.train.batch_size_starts = {0, 20, 30};
  const ResumedBatch changed = resumed_batch(saved, state, moved);
  EXPECT_EQ(changed.history, (std::vector<int64_t>{4}));  // from the new config's, as fresh
  EXPECT_EQ(changed.in_force.train.batch_size, 4);
  EXPECT_EQ(changed.saved_in_force.train.batch_size, 8);  // where the checkpoint's run read
}

TEST(BatchSizeSchedule, TrainerStateRecordsTheHistoryAndChecksTheCursorWithTheBatchInForce) {
  TrainConfig t = scheduled(BatchSizeUnits::kSteps);
  t.seed = 1;
  t.skip_window = 8;
  nlohmann::json doc = {
      {"step", 12},
      {"tokens_seen", 10 * 64 + 2 * 128},
      {"data_cursor", 40 + 16},
      {"seed", 1},
      {"replay_origin", {{"step", 10}, {"data_cursor", 40}, {"tokens_seen", 640}}},
      {"batch_size_history", {4, 8}},
      {"step_guard", {{"losses", {1.0}}, {"grad_norms", {1.0}}, {"skipped", 0}}},
      {"gerrymandering",
       {{"lb", nlohmann::json::array()},
        {"imbalance", nlohmann::json::array()},
        {"flagged", false}}}};
  const TrainerState s = parse_trainer_state(doc.dump(), "x", t);
  EXPECT_EQ(s.batch_size_history, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(s.batch_size_in_force(t), 8);
  auto rejected = [&](const nlohmann::json& history, const std::string& needle) {
    nlohmann::json bad = doc;
    bad["batch_size_history"] = history;
    try {
      parse_trainer_state(bad.dump(), "ckpt/trainer_state.json", t);
      ADD_FAILURE() << history.dump();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(needle), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  };
  rejected({8}, "is not a history of train.batch_sizes");      // starts at train.batch_size
  rejected({4, 16}, "is not a history of train.batch_sizes");  // not one of the sizes
  rejected({4, 4, 8}, "is not a history of train.batch_sizes");
  rejected(nlohmann::json::array(), "must be a non-empty array");
  rejected({4, 2}, "data_cursor=56 does not match");  // the cursor read batches of 8
}

TEST(BatchSizeSchedule, RatesOlmoCoreHoldsStayWhileInitialLrMoves) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.schedule = LrSchedule::kWsd;
  c.warmup_steps = 0;
  c.decay_steps = 4;
  const double initial_lr = 2e-3;
  // WSD: the peak is initial_lr, its decay_min_lr a rate (lr x min_lr_ratio), reached at the end.
  EXPECT_EQ(learning_rate(c, 0, 10, 0, {}, 0, initial_lr), initial_lr);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9, 10, 0, {}, 0, initial_lr), 1e-4);
  // The cosine's alpha_f floor is of initial_lr.
  c.schedule = LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(learning_rate(c, 9, 10, 0, {}, 0, initial_lr), 2e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9, 10), 1e-4);  // 0: optim.lr
}

TEST(BatchSizeSchedule, TheScheduleIsCheckedAtTheNewInitialLrWhereOlmoCoreAsserts) {
  // WSDS: each decay must fall from initial_lr x its multiplier to lr x min_lr_ratio; a batch
  // quartered halves initial_lr, below that floor here.
  OptimConfig c;
  c.lr = 1e-3;
  c.schedule = LrSchedule::kWsds;
  c.min_lr_ratio = 0.6;
  c.warmup_steps = 0;
  c.decay_steps = 2;
  c.period_steps = {10, 10};
  EXPECT_NO_THROW(validate_lr_schedule(c, 20, 64));
  EXPECT_NO_THROW(validate_lr_schedule(c, 20, 64, {}, 0, 0, 2e-3));
  try {
    validate_lr_schedule(c, 20, 64, {}, 0, 0, 5e-4);
    ADD_FAILURE() << "a rising WSDS decay was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not below it"), std::string::npos) << e.what();
  }
  // A warm-up asserts it rises only while an update is still in it: past it, a lower initial_lr
  // below warmup_min_lr is OLMo-core's to train.
  OptimConfig w;
  w.lr = 1e-3;
  w.schedule = LrSchedule::kCosine;
  w.warmup_steps = 5;
  w.warmup_min_lr = 6e-4;
  EXPECT_THROW(validate_lr_schedule(w, 20, 64, {2, 128}, 0, 0, 5e-4), Error);
  EXPECT_NO_THROW(validate_lr_schedule(w, 20, 64, {10, 640}, 0, 0, 5e-4));
}

TEST(BatchSizeSchedule, TheKeysRoundTripThroughConfigToml) {
  RunConfig c = parse_run_config(
      "[train]\nbatch_size = 4\nmicrobatches = 2\nbatch_sizes = [4, 8]\n"
      "batch_size_starts = [0, 640]\nbatch_size_units = \"tokens\"\n",
      "c.toml");
  EXPECT_EQ(c.train.batch_sizes, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(c.train.batch_size_starts, (std::vector<int64_t>{0, 640}));
  EXPECT_EQ(c.train.batch_size_units, BatchSizeUnits::kTokens);
  const RunConfig back = parse_run_config(run_config_to_toml(c), "back.toml");
  EXPECT_EQ(back.train.batch_sizes, c.train.batch_sizes);
  EXPECT_EQ(back.train.batch_size_starts, c.train.batch_size_starts);
  EXPECT_EQ(back.train.batch_size_units, BatchSizeUnits::kTokens);
  EXPECT_FALSE(batch_keys_changed(c.train, back.train));
}

}  // namespace
}  // namespace moecore
