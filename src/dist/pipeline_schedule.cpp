#include "dist/pipeline_schedule.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace moecore::dist {

std::vector<int64_t> split_layers(int64_t layers, int64_t chunks,
                                  const std::vector<int64_t>& stage_layers) {
  MOE_CHECK(chunks >= 1, "[parallel] {} model chunks", chunks);
  if (!stage_layers.empty()) {
    MOE_CHECK(static_cast<int64_t>(stage_layers.size()) == chunks,
              "[parallel] parallel.stage_layers has {} entries but pp x virtual_stages = {} model "
              "chunks",
              stage_layers.size(), chunks);
    for (int64_t n : stage_layers)
      MOE_CHECK(n >= 1, "[parallel] parallel.stage_layers entries must be >= 1 (got {})", n);
    const int64_t sum = std::accumulate(stage_layers.begin(), stage_layers.end(), int64_t{0});
    MOE_CHECK(sum == layers,
              "[parallel] parallel.stage_layers sums to {} layers but the model has {}", sum,
              layers);
    return stage_layers;
  }
  MOE_CHECK(layers >= chunks,
            "[parallel] {} layers cannot fill pp x virtual_stages = {} model chunks", layers,
            chunks);
  std::vector<int64_t> split(static_cast<size_t>(chunks), layers / chunks);
  for (int64_t i = 0; i < layers % chunks; ++i) ++split[static_cast<size_t>(i)];
  return split;
}

std::vector<LayerRange> stage_chunks(const std::vector<int64_t>& layers_per_chunk, int64_t pp,
                                     int64_t stage) {
  std::vector<int64_t> starts(layers_per_chunk.size() + 1, 0);
  std::partial_sum(layers_per_chunk.begin(), layers_per_chunk.end(), starts.begin() + 1);
  std::vector<LayerRange> ranges;
  for (size_t c = static_cast<size_t>(stage); c < layers_per_chunk.size();
       c += static_cast<size_t>(pp))
    ranges.push_back({starts[c], starts[c + 1]});
  return ranges;
}

namespace {

// Interleaved 1F1B (Megatron-LM's order): the k-th forward of a stage is chunk (k / pp) % v of
// micro-batch (k / (pp v)) pp + k % pp; backwards walk the chunks in reverse.
PipelineAction interleaved_action(int64_t k, bool forward, int64_t pp, int64_t v) {
  const int64_t in_group = (k / pp) % v;
  const int64_t micro = (k / (pp * v)) * pp + k % pp;
  return {forward, forward ? in_group : v - 1 - in_group, micro};
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule kind, int64_t pp, int64_t stage,
                                              int64_t v, int64_t m) {
  MOE_CHECK(pp >= 1 && stage >= 0 && stage < pp && v >= 1 && m >= 1,
            "[parallel] bad pipeline shape pp={} stage={} virtual_stages={} microbatches={}", pp,
            stage, v, m);
  std::vector<PipelineAction> actions;
  if (kind == PipelineSchedule::kGPipe) {
    MOE_CHECK(v == 1, "[parallel] the gpipe schedule runs one chunk per stage (virtual_stages=1)");
    for (int64_t i = 0; i < m; ++i) actions.push_back({true, 0, i});
    // Backwards in the forwards' order (as PiPPy's GPipe): the gradients then add up in the
    // same order as without a pipeline.
    for (int64_t i = 0; i < m; ++i) actions.push_back({false, 0, i});
    return actions;
  }
  if (kind == PipelineSchedule::kOneFOneB) {
    MOE_CHECK(v == 1,
              "[parallel] the 1f1b schedule runs one chunk per stage (virtual_stages=1); "
              "use interleaved-1f1b for more");
    const int64_t warmup = std::min(pp - stage - 1, m);
    for (int64_t i = 0; i < warmup; ++i) actions.push_back({true, 0, i});
    for (int64_t i = 0; i < m - warmup; ++i) {
      actions.push_back({true, 0, warmup + i});
      actions.push_back({false, 0, i});
    }
    for (int64_t i = m - warmup; i < m; ++i) actions.push_back({false, 0, i});
    return actions;
  }
  MOE_CHECK(m % pp == 0,
            "[parallel] interleaved-1f1b needs train.microbatches ({}) to be a multiple of "
            "parallel.pp ({})",
            m, pp);
  const int64_t total = m * v;
  const int64_t warmup = std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
  int64_t next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward)
    actions.push_back(interleaved_action(next_forward, true, pp, v));
  while (next_forward < total) {
    actions.push_back(interleaved_action(next_forward++, true, pp, v));
    actions.push_back(interleaved_action(next_backward++, false, pp, v));
  }
  while (next_backward < total)
    actions.push_back(interleaved_action(next_backward++, false, pp, v));
  return actions;
}

int64_t peak_live_activations(const std::vector<PipelineAction>& actions) {
  int64_t live = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    live += a.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace moecore::dist
