// What --resume accepts (issue 13): changes that break exact replay are listed key by key; the
// loss coefficients are such changes, not another architecture.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/resume_policy.h"
#include "train/run_config.h"

namespace moecore {
namespace {

std::vector<std::string> described(const RunConfig& a, const RunConfig& b) {
  std::vector<std::string> out;
  for (const ConfigChange& c : replay_config_changes(a, b)) out.push_back(describe(c));
  return out;
}

TEST(ResumePolicy, IdenticalConfigsHaveNoChanges) {
  RunConfig a;
  a.data.train = {"tokens/train"};
  EXPECT_TRUE(replay_config_changes(a, a).empty());
}

TEST(ResumePolicy, ReplayKeysAreListedOldToNew) {
  RunConfig a;
  a.data.train = {"a.npy"};
  RunConfig b = a;
  b.optim.lr = 0.002;
  b.train.seq_len = 64;
  b.train.batch_size = 4;
  b.train.microbatches = 2;
  b.train.precision = TrainPrecision::kBf16;
  b.train.seed = 3;
  b.train.lm_head_chunk_tokens = 512;
  b.data.train = {"b.npy"};
  EXPECT_EQ(described(a, b),
            (std::vector<std::string>{
                "optim.lr: 0.001 -> 0.002", "train.seed: 0 -> 3", "train.batch_size: 8 -> 4",
                "train.microbatches: 1 -> 2", "train.seq_len: 128 -> 64",
                "train.precision: 'fp32' -> 'bf16'", "train.lm_head_chunk_tokens: 0 -> 512",
                "data.train: ['a.npy'] -> ['b.npy']"}));
}

TEST(ResumePolicy, LossCoefficientsArePolicyNotArchitecture) {
  RunConfig a;
  RunConfig b = a;
  b.model.router_aux_loss_coef = 0.02;
  b.model.router_z_loss_coef = 0.001;
  EXPECT_EQ(model_config_difference(a.model, b.model), "");
  EXPECT_EQ(described(a, b), (std::vector<std::string>{"model.router_aux_loss_coef: 0.01 -> 0.02",
                                                       "model.router_z_loss_coef: 0 -> 0.001"}));
  b.model.hidden_size = 256;  // architecture is still architecture
  EXPECT_NE(model_config_difference(a.model, b.model).find("hidden_size"), std::string::npos);
}

// Also replay keys: the mxfp8 variants (other GEMMs quantised, other scales), what divides the
// router losses and over which ranks the load-balancing loss is, the tokens' element type, their
// order and the documents' ends (the attention's masks).
TEST(ResumePolicy, TheMxVariantsTheLossNormalizerAndTheDocumentsAreReplayKeys) {
  RunConfig a;
  a.train.precision = TrainPrecision::kMxfp8;
  a.data.dtype = "uint16";
  RunConfig b = a;
  b.train.mxfp8.expert_wgrad = true;
  b.train.mxfp8.dense = true;
  b.train.mxfp8.scale_mode = mx::ScaleMode::kFloor;
  b.model.loss_normalizer = LossNormalizer::kLabels;
  b.model.lb_loss_scope = LbLossScope::kRank;
  b.model.lb_loss_granularity = LbLossGranularity::kInstance;
  b.data.dtype = "uint32";
  b.data.order = data::OrderRule::kOlmoCore;
  b.data.document_masking = true;
  b.data.eos_id = 3;
  b.data.label_mask = {"masks"};  // which labels train
  b.data.instance_filter = true;  // which instances train
  b.data.repetition.max_count = 4;
  EXPECT_EQ(model_config_difference(a.model, b.model), "");
  EXPECT_EQ(described(a, b),
            (std::vector<std::string>{
                "model.lb_loss_scope: 'global' -> 'rank'",
                "model.lb_loss_granularity: 'local_batch' -> 'instance'",
                "model.loss_normalizer: 'tokens' -> 'labels'",
                "train.mxfp8_expert_wgrad: false -> true", "train.mxfp8_dense: false -> true",
                "train.mxfp8_scale: 'rceil' -> 'floor'", "data.label_mask: [] -> ['masks']",
                "data.dtype: 'uint16' -> 'uint32'", "data.document_masking: false -> true",
                "data.eos_id: -1 -> 3", "data.order: 'moecore' -> 'olmo-core'",
                "data.instance_filter: false -> true", "data.repetition_max_count: 32 -> 4"}));
  // The same tokens: a dtype left to the meta.json (which an explicit one must equal), an EOS
  // that ends no document without masking.
  RunConfig c = a;
  c.data.dtype = "";
  c.data.eos_id = 3;
  EXPECT_TRUE(replay_config_changes(a, c).empty());
}

TEST(ResumePolicy, MaxStepsMayChangeWithANoteWhereTheScheduleDependsOnIt) {
  RunConfig a;
  RunConfig b = a;
  b.train.max_steps = 2000;
  EXPECT_TRUE(replay_config_changes(a, b).empty());
  EXPECT_NE(horizon_note(a, b).find("train.max_steps 1000 -> 2000"), std::string::npos);
  // A cosine over its own t_max ends where it did; cosine_linear_decay's tail follows the run.
  b.optim.t_max_steps = 1500;
  EXPECT_EQ(horizon_note(a, b), "");
  b.optim.schedule = LrSchedule::kCosineLinearDecay;
  EXPECT_NE(horizon_note(a, b), "");
  b.optim.t_max_steps = 0;
  a.optim.schedule = b.optim.schedule = LrSchedule::kConstant;
  EXPECT_EQ(horizon_note(a, b), "");
  EXPECT_EQ(horizon_note(a, a), "");
}

// In tokens a schedule's end is the tokens seen and the remaining updates': another batch size
// moves it under the same max_steps; in steps it does not.
TEST(ResumePolicy, AnotherBatchSizeMovesTheEndOfAScheduleInTokens) {
  RunConfig a;
  a.optim.units = LrUnits::kTokens;
  a.optim.warmup_steps = 0;
  RunConfig b = a;
  b.train.batch_size = a.train.batch_size * 2;
  EXPECT_NE(horizon_note(a, b).find("another batch size x seq_len"), std::string::npos)
      << horizon_note(a, b);
  a.optim.units = b.optim.units = LrUnits::kSteps;
  EXPECT_EQ(horizon_note(a, b), "");
}

// Under train.max_tokens the end in tokens is max_tokens whatever the batch; in updates another
// batch size moves it (OLMo-core's max_steps from the tokens seen: 5 updates of 64 tokens, then
// 128 an update to 600 tokens is 8 updates, not 10). Changing max_tokens is free, and noted.
TEST(ResumePolicy, MaxTokensMovesTheEndAsItsUpdatesDo) {
  RunConfig a;
  a.train.max_tokens = 600;
  a.train.batch_size = 2;
  a.train.seq_len = 32;
  a.train.max_steps = max_steps_for_tokens(a.train);
  a.optim.units = LrUnits::kTokens;
  a.optim.warmup_steps = 0;
  RunConfig b = a;
  b.train.batch_size = 4;
  EXPECT_EQ(horizon_note(a, b, {}, {5, 320}), "");
  a.optim.units = b.optim.units = LrUnits::kSteps;
  a.optim.warmup_steps = b.optim.warmup_steps = 1;
  EXPECT_NE(horizon_note(a, b, {}, {5, 320})
                .find("another batch size x seq_len (train.max_tokens 600 in 8 updates instead "
                      "of 10)"),
            std::string::npos)
      << horizon_note(a, b, {}, {5, 320});
  EXPECT_TRUE(replay_config_changes(a, a).empty());
  RunConfig c = a;
  c.train.max_tokens = 900;
  EXPECT_TRUE(replay_config_changes(a, c).empty());
  EXPECT_NE(horizon_note(a, c).find("train.max_tokens 600 -> 900"), std::string::npos)
      << horizon_note(a, c);
  c.train.max_tokens = 0;
  c.train.max_steps = 12;
  EXPECT_NE(horizon_note(a, c).find("train.max_tokens 600 -> train.max_steps 12"),
            std::string::npos)
      << horizon_note(a, c);
  // In epochs: another count, or the same in other batches, moves the end.
  RunConfig e = c;
  e.train.max_epochs = 2;
  RunConfig f = e;
  f.train.max_epochs = 3;
  EXPECT_NE(horizon_note(e, f).find("train.max_epochs 2 -> 3"), std::string::npos);
  f.train.max_epochs = 2;
  EXPECT_EQ(horizon_note(e, f), "");
  f.train.batch_size = 8;
  EXPECT_NE(horizon_note(e, f).find("train.max_epochs 2 in its updates"), std::string::npos);
}

// The rowwise dispatch's capacity decides which tokens an expert-parallel run drops; without
// expert parallelism nothing is dropped and the key decides nothing.
TEST(ResumePolicy, CapacityFactorIsAReplayKeyUnderExpertParallelism) {
  RunConfig a;
  RunConfig b = a;
  b.parallel.capacity_factor = a.parallel.capacity_factor + 0.5;
  EXPECT_TRUE(replay_config_changes(a, b).empty());
  a.parallel.ep = 2;
  b.parallel.ep = 2;
  const std::vector<ConfigChange> changes = replay_config_changes(a, b);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "parallel.capacity_factor");
}

TEST(ResumePolicy, SettingsThatDoNotTouchTheWeightsMayChange) {
  RunConfig a;
  RunConfig b = a;
  b.train.log_every = 1;
  b.train.eval_every = 3;
  b.train.save_every = 5;
  b.train.keep_last = 0;
  b.train.threads = 2;
  b.train.out_dir = "elsewhere";
  b.train.gerrymander_window = 10;
  b.data.val = {"v.npy"};
  b.data.tokenizer = "t.json";
  b.parallel.ep = 2;
  b.parallel.zero = 1;
  EXPECT_TRUE(replay_config_changes(a, b).empty());
}

}  // namespace
}  // namespace moecore
