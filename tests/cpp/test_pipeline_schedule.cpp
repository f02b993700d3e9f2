// Pipeline schedules: every (chunk, micro-batch) runs one forward then one backward, the live
// activations stay within each schedule's bound, the layer split honours its override, and a
// timed simulation of all stages together never deadlocks and reproduces the 1F1B bubble
// (p - 1) / (m + p - 1), with interleaving cutting it.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "core/check.h"
#include "dist/pipeline_schedule.h"

namespace moecore::dist {
namespace {

constexpr PipelineSchedule kSchedules[] = {
    PipelineSchedule::kOneFOneB, PipelineSchedule::kInterleaved, PipelineSchedule::kGPipe};

int64_t chunks_for(PipelineSchedule s) {
  return s == PipelineSchedule::kInterleaved ? 2 : 1;
}

TEST(PipelineSchedule, EveryPassOnceForwardBeforeBackward) {
  for (PipelineSchedule kind : kSchedules)
    for (int64_t pp : {1, 2, 4})
      for (int64_t m : {4, 8}) {
        const int64_t v = chunks_for(kind);
        if (pp == 1 && v > 1) continue;
        for (int64_t stage = 0; stage < pp; ++stage) {
          const auto actions = pipeline_schedule(kind, pp, stage, v, m);
          ASSERT_EQ(static_cast<int64_t>(actions.size()), 2 * m * v);
          std::map<std::pair<int64_t, int64_t>, int> state;  // 0 none, 1 forward, 2 backward
          for (const PipelineAction& a : actions) {
            int& s = state[{a.chunk, a.micro}];
            ASSERT_EQ(s, a.forward ? 0 : 1) << "pp " << pp << " stage " << stage;
            s = a.forward ? 1 : 2;
          }
          for (const auto& [key, s] : state) EXPECT_EQ(s, 2);
        }
      }
}

TEST(PipelineSchedule, LiveActivationsStayWithinTheScheduleBound) {
  const int64_t m = 8;
  for (int64_t pp : {2, 4})
    for (int64_t stage = 0; stage < pp; ++stage) {
      // 1F1B: at most pp - stage micro-batches alive (so at most pp on any stage).
      EXPECT_EQ(
          peak_live_activations(pipeline_schedule(PipelineSchedule::kOneFOneB, pp, stage, 1, m)),
          pp - stage);
      EXPECT_EQ(peak_live_activations(pipeline_schedule(PipelineSchedule::kGPipe, pp, stage, 1, m)),
                m);
      EXPECT_LE(
          peak_live_activations(pipeline_schedule(PipelineSchedule::kInterleaved, pp, stage, 2, m)),
          (pp - stage - 1) * 2 + pp + 1);
    }
}

TEST(PipelineSchedule, RejectsWhatItCannotRun) {
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::kInterleaved, 4, 0, 2, 6), Error);  // m % pp
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::kOneFOneB, 2, 0, 2, 4), Error);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::kGPipe, 2, 2, 1, 4), Error);  // stage >= pp
}

TEST(PipelineSchedule, SplitsLayersWithTheRemainderFirstOrAsGiven) {
  EXPECT_EQ(split_layers(4, 2, {}), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(split_layers(7, 2, {}), (std::vector<int64_t>{4, 3}));  // the head's stage: fewer
  EXPECT_EQ(split_layers(7, 2, {4, 3}), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(split_layers(5, 2, {3, 2}), (std::vector<int64_t>{3, 2}));
  EXPECT_THROW(split_layers(5, 2, {3, 3}), Error);  // wrong sum
  EXPECT_THROW(split_layers(5, 2, {5}), Error);     // wrong count
  EXPECT_THROW(split_layers(5, 2, {5, 0}), Error);  // an empty chunk
  EXPECT_THROW(split_layers(3, 4, {}), Error);      // more chunks than layers
  const std::vector<int64_t> split = {1, 2, 3, 2};  // pp 2, v 2: stage 1 runs chunks 1 and 3
  const std::vector<LayerRange> ranges = stage_chunks(split, 2, 1);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].begin, 1);
  EXPECT_EQ(ranges[0].end, 3);
  EXPECT_EQ(ranges[1].begin, 6);
  EXPECT_EQ(ranges[1].end, 8);
}

// Runs every stage's schedule together in simulated time: a forward of global chunk g needs the
// forward of g - 1, a backward needs the backward of g + 1 (or, on the last chunk, its own
// forward); forward takes 1 / v, backward 2 / v. Returns the mean bubble over the stages; fails on
// a deadlock.
double simulate_bubble(PipelineSchedule kind, int64_t pp, int64_t v, int64_t m) {
  std::vector<std::vector<PipelineAction>> actions;
  for (int64_t s = 0; s < pp; ++s) actions.push_back(pipeline_schedule(kind, pp, s, v, m));
  const int64_t chunks = pp * v;
  std::map<std::tuple<bool, int64_t, int64_t>, double> done;  // (forward, global, micro) -> time
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  std::vector<double> clock(static_cast<size_t>(pp), 0.0), busy(static_cast<size_t>(pp), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < pp; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      if (i == actions[static_cast<size_t>(s)].size()) continue;
      const PipelineAction& a = actions[static_cast<size_t>(s)][i];
      const int64_t g = a.chunk * pp + s;
      std::tuple<bool, int64_t, int64_t> need;
      bool has_need = true;
      if (a.forward) {
        has_need = g > 0;
        need = {true, g - 1, a.micro};
      } else {
        need = g == chunks - 1 ? std::tuple{true, g, a.micro} : std::tuple{false, g + 1, a.micro};
      }
      double ready = 0.0;
      if (has_need) {
        const auto it = done.find(need);
        if (it == done.end()) continue;  // waits for another stage
        ready = it->second;
      }
      const double cost = (a.forward ? 1.0 : 2.0) / static_cast<double>(v);
      double& t = clock[static_cast<size_t>(s)];
      t = std::max(t, ready) + cost;
      busy[static_cast<size_t>(s)] += cost;
      done[{a.forward, g, a.micro}] = t;
      ++i;
      progress = true;
    }
  }
  for (int64_t s = 0; s < pp; ++s)
    EXPECT_EQ(next[static_cast<size_t>(s)], actions[static_cast<size_t>(s)].size())
        << "deadlock on stage " << s;
  const double makespan = *std::max_element(clock.begin(), clock.end());
  double bubble = 0.0;
  for (double b : busy) bubble += 1.0 - b / makespan;
  return bubble / static_cast<double>(pp);
}

TEST(PipelineSchedule, SimulatedBubbleMatchesTheory) {
  for (int64_t pp : {2, 4})
    for (int64_t m : {4, 8, 16}) {
      const double theory = static_cast<double>(pp - 1) / static_cast<double>(m + pp - 1);
      EXPECT_NEAR(simulate_bubble(PipelineSchedule::kOneFOneB, pp, 1, m), theory, 1e-12);
      EXPECT_NEAR(simulate_bubble(PipelineSchedule::kGPipe, pp, 1, m), theory, 1e-12);
      // Two virtual stages: each stage's share of the fill and drain halves (Megatron-LM).
      const double interleaved = simulate_bubble(PipelineSchedule::kInterleaved, pp, 2, m);
      EXPECT_LT(interleaved, theory);
      EXPECT_NEAR(interleaved, static_cast<double>(pp - 1) / static_cast<double>(2 * m + pp - 1),
                  1e-12);
    }
}

}  // namespace
}  // namespace moecore::dist
