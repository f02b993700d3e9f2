// `moecore plan --max-memory GB` (issue 17, item 5): every layout of a world size that the
// trainer accepts, varying pp (dividing the layers), ep (dividing the experts and a stage's
// ranks), ZeRO-1 on or off, the number of micro-batches (dividing the batch), the activation
// recompute mode (train.recompute) and, where the config leaves the LM head whole, the head whole
// or in chunks (train.lm_head_chunk_tokens: suggested_head_chunk's size; listed only where it
// lowers the layout's peak, since it costs a head GEMM), with dp x pp = world (dp = ep x ep_dp);
// the ones whose
// predicted peak memory per rank fits the budget, fastest first by predicted tokens/s (then the
// least memory). The config's schedule, dispatch and precision are kept; overlap_grad_reduce is
// dropped where ZeRO-1 is on (the trainer refuses both).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/hardware.h"
#include "train/run_config.h"

namespace moecore::plan {

struct LayoutChoice {
  int64_t pp = 1, ep = 1, zero = 0, microbatches = 1;
  ActivationRecompute recompute = ActivationRecompute::kNone;
  int64_t lm_head_chunk_tokens = 0;
  int64_t dp = 1, ep_dp = 1;
  double peak_bytes = 0.0;
  double step_seconds = 0.0;
  double tokens_per_s_per_rank = 0.0;
  double mfu = 0.0;
};

struct LayoutSearch {
  std::vector<LayoutChoice> fits;  // best first (all of them; the caller prints the top ones)
  int64_t valid = 0;               // layouts the trainer accepts, fitting or not
  LayoutChoice smallest;           // the valid layout of least peak memory (step time not priced)
};

// The hardware needs rates (a step time) to rank the layouts.
LayoutSearch search_layouts(const RunConfig& config, int64_t world, const Hardware& hardware,
                            double max_memory_bytes);

// The head chunk the search tries for `tokens` rows of a micro-batch on a rank: the smallest power
// of two at least tokens / ceil(vocab / hidden), so that a chunk's logits take no more memory than
// the micro-batch's hidden states (Liger-Kernel's rule for its fused linear cross-entropy), but
// not under 256 rows (or the micro-batch's), below which a GEMM runs far from its peak.
int64_t suggested_head_chunk(int64_t tokens, int64_t vocab, int64_t hidden);

// The same config with a layout's choices applied.
RunConfig with_layout(const RunConfig& config, const LayoutChoice& choice);

}  // namespace moecore::plan
