#include "plan/layout_search.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "core/check.h"
#include "dist/pipeline_schedule.h"
#include "model/params.h"
#include "plan/memory_model.h"
#include "plan/plan.h"

namespace moecore::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// The parameter layouts of the stages of one (pp, ep), by their chunks' layer ranges: the layouts
// tried for it (ZeRO, micro-batches, recompute, the head's chunks) share them, and building one
// names every tensor (a trillion-parameter model's table: most of a search's time).
using StageLayouts = std::map<std::vector<int64_t>, ParamLayout>;

const ParamLayout& stage_layout(const ModelConfig& mc, const ResolvedLayout& layout, int64_t stage,
                                StageLayouts& built) {
  const std::vector<LayerRange> ranges = dist::stage_chunks(layout.chunk_layers, layout.pp, stage);
  std::vector<int64_t> key{layout.ep};
  for (const LayerRange& r : ranges) key.insert(key.end(), {r.begin, r.end});
  auto it = built.find(key);
  if (it == built.end())
    it = built.emplace(key, ParamLayout::build(mc, layout.ep, 0, ranges)).first;
  return it->second;
}

// The peak of the largest rank. Stages whose chunks have the same layer counts, the same number
// of dense layers and the same embedding / head hold the same sizes: each is counted once (a
// trillion-parameter model's parameter table is large, and most stages are alike).
double peak_bytes(const RunConfig& c, const ResolvedLayout& layout, const Hardware& hardware,
                  StageLayouts& stage_layouts) {
  const int64_t chunks = static_cast<int64_t>(layout.chunk_layers.size());
  const int64_t dense = c.model.first_k_dense_replace;
  std::map<std::vector<int64_t>, double> seen;
  double peak = 0.0;
  int64_t begin = 0;
  std::vector<int64_t> first(static_cast<size_t>(chunks));
  for (int64_t g = 0; g < chunks; ++g) {
    first[static_cast<size_t>(g)] = begin;
    begin += layout.chunk_layers[static_cast<size_t>(g)];
  }
  for (int64_t s = 0; s < layout.pp; ++s) {
    std::vector<int64_t> key;
    for (int64_t g = s; g < chunks; g += layout.pp) {
      const int64_t b = first[static_cast<size_t>(g)];
      const int64_t n = layout.chunk_layers[static_cast<size_t>(g)];
      key.insert(key.end(), {n, std::clamp(dense - b, int64_t{0}, n), g == 0 ? 1 : 0,
                             g == chunks - 1 ? 1 : 0});
    }
    auto it = seen.find(key);
    if (it == seen.end())
      it = seen.emplace(key, run_rank_memory(c, layout, s, hardware.runtime_bytes, hardware.device,
                                             stage_layout(c.model, layout, s, stage_layouts))
                                 .peak)
               .first;
    peak = std::max(peak, it->second);
  }
  return peak;
}

}  // namespace

int64_t suggested_head_chunk(int64_t tokens, int64_t vocab, int64_t hidden) {
  const int64_t per_hidden = (vocab + hidden - 1) / hidden;
  const int64_t least = std::max<int64_t>(1, (tokens + per_hidden - 1) / per_hidden);
  int64_t chunk = 1;
  while (chunk < least) chunk *= 2;
  constexpr int64_t kLeastRows = 256;
  return std::max(chunk, std::min(kLeastRows, tokens));
}

RunConfig with_layout(const RunConfig& config, const LayoutChoice& choice) {
  RunConfig c = config;
  c.parallel.pp = choice.pp;
  c.parallel.ep = choice.ep;
  c.parallel.zero = choice.zero;
  c.parallel.stage_layers.clear();  // balanced chunks for the new pp
  if (choice.zero != 0) c.parallel.overlap_grad_reduce = false;
  c.train.microbatches = choice.microbatches;
  c.train.recompute = choice.recompute;
  c.train.lm_head_chunk_tokens = choice.lm_head_chunk_tokens;
  return c;
}

namespace {

// One candidate layout into `out`: nothing when the trainer refuses it (a micro-batch split, a
// schedule, ...); else counted, kept when it is the smallest, and listed with its step time when
// it fits. With `chunked_head_to_beat` (the whole head's peak of the same layout) the head runs
// in suggested_head_chunk's chunks and the layout counts only where its peak is below that.
// Returns the candidate's peak, or nothing when it was refused.
std::optional<double> consider(const RunConfig& config, LayoutChoice choice, int64_t world,
                               const Hardware& hardware, double max_memory_bytes,
                               std::optional<double> chunked_head_to_beat,
                               StageLayouts& stage_layouts, LayoutSearch& out) {
  RunConfig c = with_layout(config, choice);
  ResolvedLayout layout;
  try {
    layout = validate_layout(c, world);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (chunked_head_to_beat) {
    choice.lm_head_chunk_tokens =
        suggested_head_chunk(layout.local_rows * config.train.seq_len, config.model.vocab_size,
                             config.model.hidden_size);
    c.train.lm_head_chunk_tokens = choice.lm_head_chunk_tokens;
  }
  // Memory first: the step time is only priced for layouts that fit.
  choice.dp = layout.dp;
  choice.ep_dp = layout.ep_dp;
  choice.peak_bytes = peak_bytes(c, layout, hardware, stage_layouts);
  if (chunked_head_to_beat && choice.peak_bytes >= *chunked_head_to_beat) return choice.peak_bytes;
  if (out.valid++ == 0 || choice.peak_bytes < out.smallest.peak_bytes) out.smallest = choice;
  if (choice.peak_bytes <= max_memory_bytes) {
    const StepTime t = step_time(c, layout, hardware.rates);
    choice.step_seconds = t.seconds;
    choice.tokens_per_s_per_rank = t.tokens_per_s_per_rank;
    choice.mfu = t.mfu;
    out.fits.push_back(choice);
  }
  return choice.peak_bytes;
}

}  // namespace

LayoutSearch search_layouts(const RunConfig& config, int64_t world, const Hardware& hardware,
                            double max_memory_bytes) {
  MOE_CHECK(world >= 1, "[plan] --ranks={} must be positive", world);
  MOE_CHECK(max_memory_bytes > 0.0, "[plan] --max-memory must be positive");
  MOE_CHECK(hardware.rates.known(),
            "[plan] --max-memory ranks layouts by step time: --hardware {} has no rates (use "
            "h100, h200, b200 or a measured profile such as bench/results/cpu_profile.json)",
            hardware.name);
  const ModelConfig& mc = config.model;
  LayoutSearch out;
  for (int64_t pp : divisors(world)) {
    if (mc.num_hidden_layers % pp != 0) continue;
    for (int64_t ep : divisors(world / pp)) {
      if (mc.num_experts % ep != 0) continue;
      StageLayouts stage_layouts;  // this (pp, ep)'s only: one at a time in memory
      for (int64_t zero : {0, 1})
        for (int64_t m : divisors(config.train.batch_size))
          for (ActivationRecompute recompute :
               {ActivationRecompute::kNone, ActivationRecompute::kAttention,
                ActivationRecompute::kMoe, ActivationRecompute::kFull}) {
            LayoutChoice choice;
            choice.pp = pp;
            choice.ep = ep;
            choice.zero = zero;
            choice.microbatches = m;
            choice.recompute = recompute;
            choice.lm_head_chunk_tokens = config.train.lm_head_chunk_tokens;
            // A config that leaves its head whole is also tried with the head in chunks, which
            // costs a head GEMM more: listed only where it needs less memory than the whole head
            // (a head on a stage that is not the largest saves nothing).
            const std::optional<double> whole_head_peak =
                consider(config, choice, world, hardware, max_memory_bytes, std::nullopt,
                         stage_layouts, out);
            if (choice.lm_head_chunk_tokens == 0 && whole_head_peak)
              consider(config, choice, world, hardware, max_memory_bytes, whole_head_peak,
                       stage_layouts, out);
          }
    }
  }
  std::sort(out.fits.begin(), out.fits.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    return std::tie(b.tokens_per_s_per_rank, a.peak_bytes, a.pp, a.ep, a.zero, a.microbatches,
                    a.recompute, a.lm_head_chunk_tokens) <
           std::tie(a.tokens_per_s_per_rank, b.peak_bytes, b.pp, b.ep, b.zero, b.microbatches,
                    b.recompute, b.lm_head_chunk_tokens);
  });
  return out;
}

}  // namespace moecore::plan
