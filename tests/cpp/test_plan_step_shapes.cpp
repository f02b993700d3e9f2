// The planner over a run's update shapes (plan/step_shapes.h): a sequence-length warm-up's and a
// batch-size schedule's updates, each rank's buffers at the largest size they are given, the
// activation slots one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "plan/memory_model.h"
#include "plan/plan.h"
#include "plan/step_shapes.h"
#include "plan_test_config.h"
#include "train/layout_validation.h"

namespace moecore::plan {
namespace {

// small_config: batch 8 in 2 micro-batches of 4 sequences x 16 tokens.
std::vector<StepShape> shapes_of(const std::vector<std::string>& overrides, int64_t world = 1) {
  const RunConfig c = small_config(overrides);
  return run_step_shapes(c.train, validate_layout(c, world));
}

TEST(PlanStepShapes, OneShapeWithoutASchedule) {
  const std::vector<StepShape> shapes = shapes_of({});
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].seq_len, 16);
  EXPECT_EQ(shapes[0].microbatches, 2);
  EXPECT_EQ(shapes[0].local_rows, 4);
  const Plan p = make_plan(small_config(), 1, kNoRuntime);
  EXPECT_TRUE(p.stages[0].shape_updates.empty());
}

TEST(PlanStepShapes, MeltedWarmupHoldsMoreTokensAMicroBatch) {
  // Warm-up from 4 tokens over 3 updates: 4 + 12 x s / 3 tokens, rounded down to 4 x 2^k:
  // 8 (update 1: 16 / 8 = 2 pieces), 8 (update 2: 12 // 4 = 3 -> 2), 16 after.
  const std::vector<StepShape> shapes =
      shapes_of({"train.seq_len_warmup_steps=3", "train.seq_len_warmup_min=4"});
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_FALSE(shapes[0].cut);
  EXPECT_EQ(shapes[0].updates, "update 4 on");
  // OLMo-core's split: rank_microbatch_size (4 x 16 tokens) x 2 pieces // 8 = 16 rows; the rank's
  // 8 instances make 16 rows: one micro-batch holding the whole batch.
  EXPECT_TRUE(shapes[1].cut);
  EXPECT_EQ(shapes[1].updates, "warm-up updates 1-2");
  EXPECT_EQ(shapes[1].seq_len, 8);
  EXPECT_EQ(shapes[1].microbatches, 1);
  EXPECT_EQ(shapes[1].local_rows, 16);
  EXPECT_EQ(shapes[1].tokens(), shapes[0].tokens());
}

TEST(PlanStepShapes, BatchSizesThatCannotMeetTheWarmupAreLeftOut) {
  const std::vector<std::string> base = {
      "train.batch_sizes=[8, 16]", "train.seq_len_warmup_steps=3", "train.seq_len_warmup_min=4"};
  auto count_cut = [](const std::vector<StepShape>& shapes) {
    int n = 0;
    for (const StepShape& s : shapes) n += s.cut ? 1 : 0;
    return n;
  };
  // Due after 2 updates (before update 3, in the warm-up) or after 3 (after it).
  std::vector<std::string> met = base, missed = base;
  met.push_back("train.batch_size_starts=[0, 2]");
  missed.push_back("train.batch_size_starts=[0, 3]");
  EXPECT_EQ(count_cut(shapes_of(met)), 2);
  EXPECT_EQ(count_cut(shapes_of(missed)), 1);
  // In tokens: 2 updates of at most 16 x 16 tokens reach 512, not 513.
  std::vector<std::string> tokens_met = base, tokens_missed = base;
  tokens_met.insert(tokens_met.end(),
                    {"train.batch_size_units=\"tokens\"", "train.batch_size_starts=[0, 512]"});
  tokens_missed.insert(tokens_missed.end(),
                       {"train.batch_size_units=\"tokens\"", "train.batch_size_starts=[0, 513]"});
  EXPECT_EQ(count_cut(shapes_of(tokens_met)), 2);
  EXPECT_EQ(count_cut(shapes_of(tokens_missed)), 1);
  // Every batch size is a shape of its own after the warm-up: 2 and 4 micro-batches.
  const std::vector<StepShape> shapes = shapes_of(missed);
  EXPECT_EQ(shapes[0].microbatches, 2);
  EXPECT_EQ(shapes[1].microbatches, 4);
  EXPECT_EQ(shapes[1].updates, "batch size 16, update 4 on");
}

TEST(PlanStepShapes, PeakIsTheShapesTogether) {
  // One rank, no pipeline: one activation slot, as large as the warm-up's micro-batch; the peak
  // is at least each shape's alone, and the largest alone here (every buffer grows together).
  const Plan p = make_plan(
      small_config({"train.seq_len_warmup_steps=3", "train.seq_len_warmup_min=4"}), 1, kNoRuntime);
  const RankMemory& m = p.stages[0];
  ASSERT_EQ(m.shape_peaks.size(), 2u);
  const Plan steady = make_plan(small_config(), 1, kNoRuntime);
  EXPECT_DOUBLE_EQ(m.shape_peaks[0], steady.stages[0].peak);
  EXPECT_GT(m.shape_peaks[1], m.shape_peaks[0]);
  const RunConfig warm = small_config(
      {"train.microbatches=1", "train.seq_len=8", "train.batch_size=16"});  // the warm-up's shape
  const RankMemory alone = make_plan(warm, 1, kNoRuntime).stages[0];
  EXPECT_DOUBLE_EQ(m.activations, alone.activations);
  EXPECT_DOUBLE_EQ(m.workspace, alone.workspace);
  // The ids: the batch as read (2 x 4 x 16) and its cut (1 x 16 x 8) beside it, tokens and targets.
  EXPECT_DOUBLE_EQ(m.batch_tokens, 2.0 * 4.0 * (128.0 + 128.0));
  EXPECT_DOUBLE_EQ(m.peak, alone.peak + steady.stages[0].batch_tokens);
}

TEST(PlanStepShapes, EachActivationSlotIsItsLargestMicroBatch) {
  // GPipe keeps every micro-batch: 2 slots at batch 8, 4 at batch 16. A warm-up at batch 8 fills
  // the first slot with a whole rank batch (1 micro-batch of 2 x the tokens); at batch 16 the
  // slots hold the run's micro-batches. Slot 0 is the warm-up's, slots 1-3 the run's.
  const std::vector<std::string> sets = {"parallel.pp=2",
                                         "parallel.schedule=\"gpipe\"",
                                         "train.batch_sizes=[8, 16]",
                                         "train.batch_size_starts=[0, 3]",
                                         "train.seq_len_warmup_steps=3",
                                         "train.seq_len_warmup_min=4"};
  const Plan p = make_plan(small_config(sets), 2, kNoRuntime);
  for (const RankMemory& m : p.stages) {
    ASSERT_EQ(m.shape_peaks.size(), 3u);
    ASSERT_EQ(m.chunk_activations.size(), 1u);
    EXPECT_EQ(m.live_microbatches[0], 4);
    const RunConfig warm_config =
        small_config({"parallel.pp=2", "parallel.schedule=\"gpipe\"", "train.microbatches=1",
                      "train.seq_len=8", "train.batch_size=16"});
    const RankMemory warm =
        make_plan(warm_config, 2, kNoRuntime).stages[static_cast<size_t>(m.stage)];
    EXPECT_DOUBLE_EQ(m.activations, warm.chunk_activations[0] + 3.0 * m.chunk_activations[0]);
    EXPECT_GT(m.peak, *std::max_element(m.shape_peaks.begin(), m.shape_peaks.end()));
  }
}

}  // namespace
}  // namespace moecore::plan
