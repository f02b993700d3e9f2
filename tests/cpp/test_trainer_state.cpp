// trainer_state.json is checked field by field against the config that wrote it (issue 13).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "train/trainer_state.h"

namespace moecore {
namespace {

using nlohmann::json;

TrainConfig written_by() {
  TrainConfig t;
  t.seed = 11;
  t.batch_size = 4;
  t.seq_len = 16;
  t.skip_window = 8;
  return t;
}

json valid_state(int64_t step = 3) {
  return {{"step", step},
          {"tokens_seen", step * 4 * 16},
          {"data_cursor", step * 4},
          {"seed", 11},
          {"rng", {{"kind", "counter-based data order"}, {"seed", 11}}},
          {"lr_next", 0.001},
          {"step_guard", {{"losses", {2.0, 1.9}}, {"grad_norms", {1.0, 0.8}}, {"skipped", 1}}},
          {"gerrymandering", {{"lb", {1.0}}, {"imbalance", {1.2}}, {"flagged", false}}}};
}

std::string error_of(const json& state) {
  try {
    parse_trainer_state(state.dump(), "ckpt/trainer_state.json", written_by());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_state_rejected(const json& state, const std::string& needle) {
  const std::string message = error_of(state);
  EXPECT_NE(message.find("ckpt/trainer_state.json"), std::string::npos) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(TrainerState, ValidStateParses) {
  const TrainerState s = parse_trainer_state(valid_state().dump(), "x", written_by());
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.data_cursor, 12u);
  EXPECT_EQ(s.tokens_seen, 192);
  EXPECT_EQ(s.seed, 11u);
  EXPECT_EQ(s.origin, ReplayOrigin{});
  EXPECT_EQ(s.recipe_revision, 1);  // written before revisions were recorded
  json revised = valid_state();
  revised["recipe_revision"] = kRecipeRevision;
  EXPECT_EQ(parse_trainer_state(revised.dump(), "x", written_by()).recipe_revision,
            kRecipeRevision);
  revised["recipe_revision"] = kRecipeRevision + 1;  // from a newer moecore
  expect_state_rejected(revised, "recipe_revision");
}

TEST(TrainerState, NegativeOrHugeNumbersAreRefused) {
  json s = valid_state();
  s["step"] = -5;
  expect_state_rejected(s, "step=-5 is out of range");
  s = valid_state();
  s["data_cursor"] = -1;
  expect_state_rejected(s, "data_cursor=-1 is out of range");
  s = valid_state();
  s["data_cursor"] = INT64_MAX;
  expect_state_rejected(s, "data_cursor=9223372036854775807 is out of range");
  s = valid_state();
  s["seed"] = -1;
  expect_state_rejected(s, "seed=-1");
}

TEST(TrainerState, CursorAndTokensMustFollowFromTheStep) {
  json s = valid_state();
  s["data_cursor"] = 13;
  expect_state_rejected(s, "data_cursor=13 does not match step=3 x train.batch_size=4");
  s = valid_state();
  s["tokens_seen"] = 1;
  expect_state_rejected(s, "tokens_seen=1 does not match");
  s = valid_state();
  s["seed"] = 12;
  expect_state_rejected(s, "seed=12 differs from train.seed=11");
}

TEST(TrainerState, ADivergedRunsOlderCheckpointResumesWithoutItsNullSteps) {
  // Written before the gerrymandering detector left non-finite steps out: NaN as JSON null.
  json s = valid_state();
  s["gerrymandering"] = {
      {"lb", {1.0, nullptr, 0.9}}, {"imbalance", {1.2, 1.5, nullptr}}, {"flagged", false}};
  const TrainerState parsed = parse_trainer_state(s.dump(), "x", written_by());
  EXPECT_EQ(parsed.gerrymandering["lb"], json::array({1.0}));
  EXPECT_EQ(parsed.gerrymandering["imbalance"], json::array({1.2}));
  s["gerrymandering"]["lb"] = {1.0, "x", 0.9};  // anything else is still damage
  expect_state_rejected(s, "gerrymandering.lb");
}

TEST(TrainerState, ReplayOriginShiftsTheInvariant) {
  // Batch 8 until step 2 (cursor 16, 256 tokens), then batch 4 (this config) to step 5.
  json s = valid_state(5);
  s["replay_origin"] = {{"step", 2}, {"data_cursor", 16}, {"tokens_seen", 256}};
  s["data_cursor"] = 16 + 3 * 4;
  s["tokens_seen"] = 256 + 3 * 4 * 16;
  const TrainerState parsed = parse_trainer_state(s.dump(), "x", written_by());
  EXPECT_EQ(parsed.origin, (ReplayOrigin{2, 16, 256}));
  s["replay_origin"]["step"] = 6;
  expect_state_rejected(s, "replay_origin.step=6 is after step=5");
  // OLMo-core's loader state at the origin (data.order = "olmo-core"): epoch from 1.
  s["replay_origin"]["step"] = 2;
  s["replay_origin"]["epoch"] = 3;
  s["replay_origin"]["epoch_tokens"] = 144;
  EXPECT_EQ(parse_trainer_state(s.dump(), "x", written_by()).origin,
            (ReplayOrigin{2, 16, 256, 3, 144}));
  s["replay_origin"]["epoch"] = 0;
  expect_state_rejected(s, "replay_origin.epoch=0 must be at least 1");
  s["replay_origin"]["epoch"] = 1;
  s["replay_origin"].erase("epoch_tokens");
  expect_state_rejected(s, "replay_origin.epoch_tokens is missing");
}

TEST(TrainerState, MoreInstancesThanTheTokensFillAreDamage) {
  json s = valid_state();
  s["train_data"] = {{"tokens", 160}, {"instances", 10}, {"sample_hash", "00000000000000ab"}};
  EXPECT_EQ(parse_trainer_state(s.dump(), "x", written_by()).train_data->instances, 10);
  s["train_data"]["instances"] = 11;  // of 16 tokens: 176 > 160
  expect_state_rejected(s, "train_data.instances=11 of train.seq_len=16 tokens exceed");
}

TEST(TrainerState, WrongTypesNameTheKeyAndValue) {
  json s = valid_state();
  s["step"] = "3";
  expect_state_rejected(s, "step=\"3\" must be an integer");
  s = valid_state();
  s["step"] = 3.5;
  expect_state_rejected(s, "step=3.5 must be an integer");
  s = valid_state();
  s.erase("tokens_seen");
  expect_state_rejected(s, "tokens_seen is missing");
  s = valid_state();
  s["step_guard"]["losses"] = {1.0, "x"};
  expect_state_rejected(s, "step_guard.losses holds \"x\"");
  s = valid_state();
  s["step_guard"]["losses"] = json::array();
  for (int i = 0; i < 9; ++i) s["step_guard"]["losses"].push_back(1.0);
  expect_state_rejected(s, "more than its window of 8");
  s = valid_state();
  s["step_guard"]["skipped"] = 4;
  expect_state_rejected(s, "step_guard.skipped=4 exceeds step=3");
  s = valid_state();
  s["gerrymandering"]["flagged"] = 1;
  expect_state_rejected(s, "gerrymandering.flagged=1 must be a boolean");
  expect_state_rejected(json::array({1, 2}), "expected an object");
  const std::string broken = [] {
    try {
      parse_trainer_state("{\"step\": fals\n", "ckpt/trainer_state.json", written_by());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(broken.find("not valid JSON"), std::string::npos) << broken;
  EXPECT_EQ(broken.find('\n'), std::string::npos) << broken;
}

}  // namespace
}  // namespace moecore
