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
  EXPECT_TRUE(p.stages[0].update_shapes.empty());
}

TEST(PlanStepShapes, MeltedWarmupHoldsMoreTokensAMicroBatch) {
  // Warm-up from 4 tokens over 3 updates: 4 + 12 x s / 3 tokens, rounded down to 4 x 2^k:
  // 8 (update 1: 16 / 8 = 2 pieces), 8 (update 2: 12 // 4 = 3 -> 2), 16 from update 3 on (the
  // warm-up's last update trains whole rows).
  const std::vector<StepShape> shapes =
      shapes_of({"train.seq_len_warmup_steps=3", "train.seq_len_warmup_min=4"});
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_FALSE(shapes[0].cut);
  EXPECT_EQ(shapes[0].updates, "update 3 on");
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
  // The warm-up cuts updates 1-2. Due after 1 update (before update 2, cut) or after 2 (before
  // update 3, whole rows).
  std::vector<std::string> met = base, missed = base;
  met.push_back("train.batch_size_starts=[0, 1]");
  missed.push_back("train.batch_size_starts=[0, 2]");
  EXPECT_EQ(count_cut(shapes_of(met)), 2);
  EXPECT_EQ(count_cut(shapes_of(missed)), 1);
  // In tokens: the 1 update before update 2, of 8 x 16 tokens (the sizes before 16), reaches
  // 128, not 129.
  std::vector<std::string> tokens_met = base, tokens_missed = base;
  tokens_met.insert(tokens_met.end(),
                    {"train.batch_size_units=\"tokens\"", "train.batch_size_starts=[0, 128]"});
  tokens_missed.insert(tokens_missed.end(),
                       {"train.batch_size_units=\"tokens\"", "train.batch_size_starts=[0, 129]"});
  EXPECT_EQ(count_cut(shapes_of(tokens_met)), 2);
  EXPECT_EQ(count_cut(shapes_of(tokens_missed)), 1);
  // Every batch size is a shape of its own after the warm-up: 2 and 4 micro-batches.
  const std::vector<StepShape> shapes = shapes_of(missed);
  EXPECT_EQ(shapes[0].microbatches, 2);
  EXPECT_EQ(shapes[1].microbatches, 4);
  EXPECT_EQ(shapes[1].updates, "batch size 16, update 3 on");
  // A size whose start the run never reaches (max_steps 10: asked after at most 9 updates).
  std::vector<std::string> never = {"train.batch_sizes=[8, 16]", "train.batch_size_starts=[0, 9]",
                                    "train.max_steps=10"};
  EXPECT_EQ(shapes_of(never).size(), 2u);
  never[1] = "train.batch_size_starts=[0, 10]";
  EXPECT_EQ(shapes_of(never).size(), 1u);
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

TEST(PlanStepShapes, CutIdsKeepEachVectorsLargest) {
  // A warm-up over 8 updates from 2 tokens: its lengths rise, its micro-batches grow in number and
  // shrink in size; the trainer's cut vector k keeps the largest micro-batch k it held.
  const RunConfig c = small_config({"train.microbatches=4", "train.batch_size=8",
                                    "train.seq_len_warmup_steps=8", "train.seq_len_warmup_min=2"});
  const ResolvedLayout layout = validate_layout(c, 1);
  const std::vector<StepShape> shapes = run_step_shapes(c.train, layout);
  int64_t cut_shapes = 0, vectors = 0;
  double largest_alone = 0.0;
  for (const StepShape& s : shapes)
    if (s.cut) {
      ++cut_shapes;
      vectors = std::max(vectors, s.microbatches);
      largest_alone = std::max(largest_alone, 8.0 * static_cast<double>(s.tokens()));
    }
  ASSERT_GE(cut_shapes, 2);
  double cut_ids = 0.0;
  for (int64_t k = 0; k < vectors; ++k) {
    double largest = 0.0;
    for (const StepShape& s : shapes)
      if (s.cut && s.microbatches > k)
        largest = std::max(largest, 8.0 * static_cast<double>(s.local_rows * s.seq_len));
    cut_ids += largest;
  }
  EXPECT_GT(cut_ids, largest_alone);  // more than any one cut batch's ids
  const RankMemory m = make_plan(c, 1, kNoRuntime).stages[0];
  const double read_ids = 8.0 * 8.0 * 16.0;  // 8 sequences of 16 tokens, tokens and targets
  EXPECT_DOUBLE_EQ(m.batch_tokens, read_ids + cut_ids);
}

TEST(PlanStepShapes, BatchSizesOfWholeMicroBatchesAtEveryLayout) {
  // batch 24 in 3 micro-batches of 8, a later batch of 8; a layout search tries 4 micro-batches
  // (of 6), where the later batch is not whole micro-batches, which the trainer refuses: so does
  // the layout's check.
  RunConfig c = small_config({"train.batch_size=24", "train.microbatches=3",
                              "train.batch_sizes=[24, 8]", "train.batch_size_starts=[0, 5]"});
  (void)validate_layout(c, 1);
  c.train.microbatches = 4;
  try {
    (void)validate_layout(c, 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.batch_sizes[1]=8 is not a whole number of "
                                         "micro-batches of 6"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moecore::plan
