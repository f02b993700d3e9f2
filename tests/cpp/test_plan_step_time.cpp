// The step-time model (issue 17, items 4 and 5) pinned on what is deterministic: the pipeline
// simulation replaying the schedules' action lists reproduces the textbook bubbles, the overlap
// and core-sharing rules, the breakdown adds up to the step, and the --max-memory search returns
// only layouts that the trainer accepts and that fit, fastest first. No timing is measured here.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/check.h"
#include "model/params.h"
#include "plan/comm_model.h"
#include "plan/layout_search.h"
#include "plan/pipeline_simulation.h"
#include "plan/plan.h"
#include "plan_test_config.h"
#include "train/run_config.h"

namespace moecore::plan {
namespace {

// Uniform stages: every chunk's forward takes f, its backward b (one category each).
PipelineTimeline uniform(PipelineSchedule kind, int64_t pp, int64_t v, int64_t m, double f,
                         double b, double transfer = 0.0) {
  Seconds fwd{}, bwd{};
  fwd[static_cast<int>(TimeCategory::kAttention)] = f;
  bwd[static_cast<int>(TimeCategory::kAttention)] = b;
  const std::vector<std::vector<Seconds>> forward(
      static_cast<size_t>(pp), std::vector<Seconds>(static_cast<size_t>(v), fwd));
  const std::vector<std::vector<Seconds>> backward(
      static_cast<size_t>(pp), std::vector<Seconds>(static_cast<size_t>(v), bwd));
  return simulate_pipeline(kind, pp, v, m, forward, backward, transfer);
}

double makespan(const PipelineTimeline& t) {
  return *std::max_element(t.finish.begin(), t.finish.end());
}

TEST(PipelineSimulation, OneFOneBBubbleIsTextbook) {
  // (pp - 1) / (m + pp - 1) of the step idle, for uniform stages and free transfers.
  for (const auto& [pp, m] :
       {std::pair{2, 4}, std::pair{4, 8}, std::pair{4, 4}, std::pair{8, 16}}) {
    const double f = 1.0, b = 2.0;
    const PipelineTimeline t = uniform(PipelineSchedule::kOneFOneB, pp, 1, m, f, b);
    const double step = makespan(t);
    EXPECT_DOUBLE_EQ(step, static_cast<double>(m + pp - 1) * (f + b)) << pp << " " << m;
    // Every stage is busy m (f + b) and waits the rest of the step.
    for (int64_t s = 0; s < pp; ++s) {
      EXPECT_DOUBLE_EQ(total_seconds(t.busy[static_cast<size_t>(s)]),
                       static_cast<double>(m) * (f + b));
    }
    EXPECT_DOUBLE_EQ(t.wait[0] / step,
                     static_cast<double>(pp - 1) / static_cast<double>(m + pp - 1));
  }
}

TEST(PipelineSimulation, GPipeHasTheSameBubbleAsOneFOneB) {
  const PipelineTimeline g = uniform(PipelineSchedule::kGPipe, 4, 1, 8, 1.0, 2.0);
  EXPECT_DOUBLE_EQ(makespan(g), 11.0 * 3.0);
}

TEST(PipelineSimulation, InterleavingShrinksTheBubble) {
  // Each stage's work split over v chunks: Megatron's interleaved bubble is (pp - 1) (f + b) / v.
  const int64_t pp = 4, m = 8, v = 2;
  const double f = 1.0, b = 2.0;
  const double plain = makespan(uniform(PipelineSchedule::kOneFOneB, pp, 1, m, f, b));
  const double inter = makespan(uniform(PipelineSchedule::kInterleaved, pp, v, m, f / v, b / v));
  EXPECT_LT(inter, plain);
  EXPECT_GE(inter, static_cast<double>(m) * (f + b) + static_cast<double>(pp - 1) * (f + b) / v);
}

TEST(PipelineSimulation, TransfersDelayTheCriticalPath) {
  // The first micro-batch's forward crosses pp - 1 links and its backward crosses them back.
  const double t = 0.25;
  const double step = makespan(uniform(PipelineSchedule::kOneFOneB, 4, 1, 8, 1.0, 2.0, t));
  EXPECT_GE(step, 11.0 * 3.0 + 2.0 * 3.0 * t);
  EXPECT_LE(step, 11.0 * 3.0 + 2.0 * 8.0 * 3.0 * t);  // at most every exchange on the path
}

TEST(PipelineSimulation, SingleStageNeverWaits) {
  const PipelineTimeline t = uniform(PipelineSchedule::kOneFOneB, 1, 1, 4, 1.0, 2.0);
  EXPECT_DOUBLE_EQ(t.wait[0], 0.0);
  EXPECT_DOUBLE_EQ(t.finish[0], 12.0);
  EXPECT_DOUBLE_EQ(t.last_backward[0], 2.0);
}

StepTime plan_step(const std::vector<std::string>& overrides, int64_t world, const Rates& r) {
  const RunConfig c = small_config(overrides);
  return step_time(c, validate_layout(c, world), r);
}

double category(const StepTime& t, TimeCategory c) {
  return t.breakdown[static_cast<size_t>(static_cast<int>(c))];
}

TEST(StepTime, BreakdownAddsUpAndThroughputFollows) {
  const StepTime t = plan_step({"parallel.pp=2", "train.microbatches=4"}, 4, test_rates());
  EXPECT_NEAR(total_seconds(t.breakdown), t.seconds, 1e-12 * t.seconds);
  EXPECT_DOUBLE_EQ(t.tokens_per_s_per_rank, 8.0 * 16.0 / t.seconds / 4.0);
  EXPECT_GT(category(t, TimeCategory::kPipelineWait), 0.0);
  EXPECT_EQ(t.stage_seconds.size(), 2u);
  EXPECT_DOUBLE_EQ(t.seconds, *std::max_element(t.stage_seconds.begin(), t.stage_seconds.end()));
}

TEST(StepTime, OverlapHidesReductionsOnlyWithAsyncCommunication) {
  Rates sync = test_rates(), async = test_rates();
  async.async_communication = true;
  const StepTime plain = plan_step({}, 2, sync);
  const StepTime overlap_sync = plan_step({"parallel.overlap_grad_reduce=true"}, 2, sync);
  const StepTime overlap_async = plan_step({"parallel.overlap_grad_reduce=true"}, 2, async);
  const double reduce = category(plain, TimeCategory::kGradReduce);
  EXPECT_GT(reduce, 0.0);
  // Open MPI on a CPU progresses a nonblocking collective only inside MPI calls: nothing hidden.
  EXPECT_DOUBLE_EQ(category(overlap_sync, TimeCategory::kGradReduce), reduce);
  // With its own progress, the reduction runs under the last micro-batch's backward; what stays
  // exposed is at least one layer's share (the last gradients are ready only at the end).
  const double exposed = category(overlap_async, TimeCategory::kGradReduce);
  EXPECT_LT(exposed, reduce);
  EXPECT_GE(exposed, reduce / 4.0 - 1e-15);
  EXPECT_DOUBLE_EQ(category(overlap_async, TimeCategory::kExperts),
                   category(plain, TimeCategory::kExperts));
}

TEST(StepTime, RanksSharingCoresRunAtTheirShare) {
  Rates own = test_rates(), shared = test_rates();
  shared.cores_per_node = 2;  // 4 ranks on 2 cores: half the rates each
  const StepTime a = plan_step({}, 4, own), b = plan_step({}, 4, shared);
  for (TimeCategory c : {TimeCategory::kAttention, TimeCategory::kExperts,
                         TimeCategory::kElementwise, TimeCategory::kOptimizer})
    EXPECT_DOUBLE_EQ(category(b, c), 2.0 * category(a, c));
  // The link is not shared out, the reduction's element-wise sum is.
  EXPECT_GT(category(b, TimeCategory::kGradReduce), category(a, TimeCategory::kGradReduce));
  EXPECT_LT(category(b, TimeCategory::kGradReduce), 2.0 * category(a, TimeCategory::kGradReduce));
}

TEST(StepTime, GemmAddsItsMemoryTimeUnlessTheHardwareOverlapsThem) {
  Rates added = test_rates(), overlapped = test_rates();
  overlapped.gemm_overlaps_memory = true;
  const StepTime a = plan_step({}, 1, added), o = plan_step({}, 1, overlapped);
  // The small model's expert GEMMs: at 1 GFLOP/s and 1 GB/s both terms are of the same order,
  // so their sum exceeds the larger one, but by no more than a factor of two.
  for (TimeCategory c : {TimeCategory::kAttention, TimeCategory::kExperts, TimeCategory::kLmHead}) {
    EXPECT_GT(category(a, c), category(o, c));
    EXPECT_LE(category(a, c), 2.0 * category(o, c) * (1 + 1e-12));
  }
  EXPECT_DOUBLE_EQ(category(a, TimeCategory::kOptimizer), category(o, TimeCategory::kOptimizer));
  // GPUs overlap them; a JSON profile follows its "device" unless it says otherwise.
  EXPECT_TRUE(load_hardware("h100").rates.gemm_overlaps_memory);
}

TEST(StepTime, EachModuleAtItsRecipesRate) {
  Rates r = test_rates();
  r.gemm_flops_mxfp8 = r.gemm_flops_bf16 / 4.0;  // a CPU: the exact MX GEMM is the slowest
  r.mx_quantize_values = 1e9;
  r.mx_weight_refresh_values = 1e8;
  const auto at = [&](std::vector<std::string> sets, TimeCategory c) {
    // MXFP8 quantises both dimensions of a weight in blocks of 32.
    for (const char* width :
         {"model.moe_intermediate_size=32", "model.intermediate_size=64",
          "model.shared_expert_intermediate_size=32", "model.num_key_value_heads=4"})
      sets.emplace_back(width);
    return category(plan_step(sets, 1, r), c);
  };
  const std::vector<std::string> bf16{"train.precision=\"bf16\""},
      mxfp8{"train.precision=\"mxfp8\""},
      mxfp8_dense{"train.precision=\"mxfp8\"", "train.mxfp8_dense=true"};
  // OLMo-core's recipe: only the routed and shared experts' GEMMs move to the MX rate (with their
  // activations' quantisation), and their weights are re-quantised after every step.
  EXPECT_GT(at(mxfp8, TimeCategory::kExperts), at(bf16, TimeCategory::kExperts));
  for (TimeCategory c : {TimeCategory::kAttention, TimeCategory::kLmHead})
    EXPECT_DOUBLE_EQ(at(mxfp8, c), at(bf16, c));
  EXPECT_GT(at(mxfp8, TimeCategory::kOptimizer), at(bf16, TimeCategory::kOptimizer));
  const double experts = at(mxfp8, TimeCategory::kExperts);
  r.mx_quantize_values /= 2.0;
  EXPECT_GT(at(mxfp8, TimeCategory::kExperts), experts);
  const double refresh = at(mxfp8, TimeCategory::kOptimizer);
  r.mx_weight_refresh_values /= 2.0;
  EXPECT_GT(at(mxfp8, TimeCategory::kOptimizer), refresh);
  // mxfp8_dense: the attention projections too (not the attention core).
  EXPECT_GT(at(mxfp8_dense, TimeCategory::kAttention), at(mxfp8, TimeCategory::kAttention));
  EXPECT_DOUBLE_EQ(at(mxfp8_dense, TimeCategory::kLmHead), at(bf16, TimeCategory::kLmHead));
  // The experts' weight gradient in MX as well: slower still at this rate.
  EXPECT_GT(
      at({"train.precision=\"mxfp8\"", "train.mxfp8_expert_wgrad=true"}, TimeCategory::kExperts),
      at(mxfp8, TimeCategory::kExperts));
  // No MX rate in the profile (Hopper's dequantised path): MX GEMMs at the bf16 rate, only the
  // quantisation on top.
  r.gemm_flops_mxfp8 = 0.0;
  r.mx_quantize_values = 1e30;
  EXPECT_NEAR(at(mxfp8, TimeCategory::kExperts), at(bf16, TimeCategory::kExperts),
              1e-9 * at(bf16, TimeCategory::kExperts));
  EXPECT_DOUBLE_EQ(load_hardware("h200").rates.gemm_flops_mxfp8, 0.0);
  EXPECT_GT(load_hardware("b200").rates.gemm_flops_mxfp8,
            1.9 * load_hardware("b200").rates.gemm_flops_bf16);
}

TEST(StepTime, BusBandwidthReadsLogLinearlyBetweenMeasuredSizes) {
  BusBandwidth bus;
  EXPECT_DOUBLE_EQ(bus.at(1e6), 0.0);  // not measured
  bus.points = {{1e6, 4e9}, {1e8, 2e9}};
  EXPECT_DOUBLE_EQ(bus.at(1e6), 4e9);
  EXPECT_DOUBLE_EQ(bus.at(1e8), 2e9);
  EXPECT_NEAR(bus.at(1e7), 3e9, 1e-3);  // halfway in log size
  EXPECT_DOUBLE_EQ(bus.at(1e3), 4e9);   // the nearest measurement beyond the ends
  EXPECT_DOUBLE_EQ(bus.at(1e12), 2e9);
}

TEST(StepTime, MeasuredBusBandwidthPricesTheGradientCollectives) {
  // dp 2 on one node: the dense and expert all-reduces at a measured bus bandwidth, flat in
  // size: 2 (n - 1) / n x bytes / bandwidth + 2 (n - 1) latencies each.
  Rates measured = test_rates();
  measured.allreduce_bus.points = {{1.0, 5e8}};
  const RunConfig c = small_config({});
  const ResolvedLayout layout = validate_layout(c, 2);
  double bytes = 0.0;
  int64_t calls = 0;
  for (const CollectiveBytes& b : rank_collectives(c, layout, 0)) {
    ASSERT_EQ(b.op, "allreduce");
    bytes += b.bytes;
    ++calls;
  }
  const StepTime t = step_time(c, layout, measured);
  EXPECT_NEAR(category(t, TimeCategory::kGradReduce),
              bytes / 5e8 + 2.0 * static_cast<double>(calls) * measured.link_latency,
              1e-12 * bytes / 5e8);
  // Measured with 2 ranks on a node of 2 cores, priced for 4 ranks sharing it: half the rate.
  measured.cores_per_node = 2.0;
  measured.collective_ranks = 2;
  const ResolvedLayout four = validate_layout(c, 4);
  double four_bytes = 0.0;
  int64_t four_calls = 0;
  for (const CollectiveBytes& b : rank_collectives(c, four, 0)) {
    four_bytes += 2.0 * 3.0 / 4.0 * b.bytes;
    ++four_calls;
  }
  EXPECT_NEAR(
      category(step_time(c, four, measured), TimeCategory::kGradReduce),
      four_bytes / 2.5e8 + 2.0 * 3.0 * static_cast<double>(four_calls) * measured.link_latency,
      1e-12 * four_bytes / 2.5e8);
}

TEST(StepTime, ZeroAddsItsCopiesToTheReduction) {
  Rates measured = test_rates();
  measured.reduce_scatter_bus.points = {{1.0, 5e8}};
  measured.allgather_bus.points = {{1.0, 5e8}};
  const RunConfig c = small_config({"parallel.zero=1"});
  const ResolvedLayout layout = validate_layout(c, 2);
  double bus_bytes = 0.0;
  int64_t calls = 0;
  for (const CollectiveBytes& b : rank_collectives(c, layout, 0)) {
    ASSERT_TRUE(b.op == "reduce_scatter" || b.op == "allgather") << b.op;
    bus_bytes += b.op == "reduce_scatter" ? 0.5 * b.bytes : b.bytes;  // n = 2
    ++calls;
  }
  // The padded send buffer written, the gradients copied into it, the gathered weights copied
  // back: 20 bytes per local parameter at the memory bandwidth.
  const ParamLayout params = ParamLayout::build(c.model);
  const double local =
      static_cast<double>(params.numel(ParamGroup::kDense) + params.numel(ParamGroup::kExpert));
  EXPECT_NEAR(category(step_time(c, layout, measured), TimeCategory::kGradReduce),
              bus_bytes / 5e8 + static_cast<double>(calls) * measured.link_latency +
                  20.0 * local / measured.memory_bandwidth,
              1e-9);
}

TEST(StepTime, ExpertExchangeOnlyWithExpertParallelism) {
  const StepTime dp = plan_step({}, 2, test_rates());
  const StepTime ep = plan_step({"parallel.ep=2"}, 2, test_rates());
  EXPECT_DOUBLE_EQ(category(dp, TimeCategory::kExpertExchange), 0.0);
  EXPECT_GT(category(ep, TimeCategory::kExpertExchange), 0.0);
}

TEST(StepTime, GpuProfilesCarryDataSheetRates) {
  const Hardware h200 = load_hardware("h200"), b200 = load_hardware("b200");
  EXPECT_TRUE(h200.rates.known());
  EXPECT_DOUBLE_EQ(h200.rates.peak_flops_bf16, 989e12);
  EXPECT_DOUBLE_EQ(b200.rates.memory_bandwidth, 7.7e12);
  EXPECT_FALSE(load_hardware("cpu").rates.known());  // measured, never a data sheet
}

TEST(LayoutSearch, FastestFirstAndAllFit) {
  Hardware hw{"test", 1e12, 0.0, "test", false, test_rates()};
  const RunConfig c = small_config();
  const LayoutSearch search = search_layouts(c, 4, hw, 1e12);
  const std::vector<LayoutChoice>& all = search.fits;
  EXPECT_EQ(search.valid, static_cast<int64_t>(all.size()));
  ASSERT_FALSE(all.empty());
  double smallest = all.front().peak_bytes;
  for (size_t i = 0; i < all.size(); ++i) {
    const LayoutChoice& l = all[i];
    EXPECT_EQ(l.pp * l.ep * l.ep_dp, 4);
    EXPECT_EQ(c.model.num_experts % l.ep, 0);
    EXPECT_EQ(c.model.num_hidden_layers % l.pp, 0);
    EXPECT_NO_THROW(validate_layout(with_layout(c, l), 4));
    if (i > 0) {
      EXPECT_LE(l.tokens_per_s_per_rank, all[i - 1].tokens_per_s_per_rank);
    }
    smallest = std::min(smallest, l.peak_bytes);
  }
  // Both ZeRO settings, several ep and pp values are among them.
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const LayoutChoice& l) { return l.zero; }));
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const LayoutChoice& l) { return l.pp == 4; }));
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const LayoutChoice& l) { return l.ep == 4; }));
  EXPECT_DOUBLE_EQ(search.smallest.peak_bytes, smallest);
  // Every stage priced, not only the distinct ones: the search's peaks are the plan's.
  for (const LayoutChoice& l : all)
    EXPECT_DOUBLE_EQ(l.peak_bytes, make_plan(with_layout(c, l), 4, hw).peak_bytes());
  // A budget just above the smallest peak keeps that layout and drops every larger one.
  const LayoutSearch tight = search_layouts(c, 4, hw, smallest * (1.0 + 1e-9));
  ASSERT_FALSE(tight.fits.empty());
  for (const LayoutChoice& l : tight.fits) EXPECT_LE(l.peak_bytes, smallest * (1.0 + 1e-9));
  const LayoutSearch none = search_layouts(c, 4, hw, smallest * 0.999);
  EXPECT_TRUE(none.fits.empty());
  EXPECT_DOUBLE_EQ(none.smallest.peak_bytes, smallest);
}

TEST(LayoutSearch, RecomputeFitsBudgetsThatNoneCannot) {
  Hardware hw{"test", 1e12, 0.0, "test", false, test_rates()};
  const RunConfig c = small_config();
  const LayoutSearch all = search_layouts(c, 4, hw, 1e12);
  double least_without = 1e300, least_full = 1e300;
  for (const LayoutChoice& l : all.fits) {
    if (l.recompute == ActivationRecompute::kNone)
      least_without = std::min(least_without, l.peak_bytes);
    if (l.recompute == ActivationRecompute::kFull) least_full = std::min(least_full, l.peak_bytes);
  }
  EXPECT_LT(all.smallest.peak_bytes, least_without);
  // Full recompute reaches the least memory. With one layer per stage (pp 4) "moe" ties it: what
  // full drops beyond moe's share (the stage's one attention sublayer and mid residual) it
  // rebuilds in the backward, and flash attention keeps no T x T term that made full smaller.
  EXPECT_NE(all.smallest.recompute, ActivationRecompute::kNone);
  EXPECT_DOUBLE_EQ(all.smallest.peak_bytes, least_full);
  // Below what any layout needs without recompute, the search still proposes layouts: each
  // recomputes, and planned on its own (with_layout carries train.recompute) it fits.
  const LayoutSearch tight = search_layouts(c, 4, hw, least_without * 0.999);
  ASSERT_FALSE(tight.fits.empty());
  for (const LayoutChoice& l : tight.fits) {
    EXPECT_NE(l.recompute, ActivationRecompute::kNone);
    EXPECT_DOUBLE_EQ(make_plan(with_layout(c, l), 4, hw).peak_bytes(), l.peak_bytes);
  }
  // Among layouts equal but for the mode, none is fastest: recompute only costs time.
  EXPECT_EQ(all.fits.front().recompute, ActivationRecompute::kNone);
}

TEST(LayoutSearch, NeedsRates) {
  const Hardware hw{"test", 1e12, 0.0, "test", false, {}};
  EXPECT_THROW(search_layouts(small_config(), 4, hw, 1e12), Error);
}

}  // namespace
}  // namespace moecore::plan
