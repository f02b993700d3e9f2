// Roofline cost of one micro-batch through one model chunk on one rank (issue 17, item 4): every
// GEMM at max(FLOPs / GEMM rate, bytes / memory bandwidth); the element-wise work (norms, RoPE,
// SwiGLU, softmax, routing, permutes, the loss) as the bytes of the activations it saves streamed
// through memory (the forward writes and re-reads them, the backward reads them and writes and
// re-reads their gradients); the expert-parallel exchange as its bytes over the link plus one
// latency per peer, blocking, as the dispatchers run it. Routing is planned balanced.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "plan/activation_model.h"
#include "plan/hardware.h"
#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

// Where a step's time goes. Compute categories first; the last four are not compute.
enum class TimeCategory : int {
  kAttention = 0,   // q/k/v/o projections and the attention core
  kDenseMlp,        // first_k_dense_replace layers' SwiGLU MLP
  kExperts,         // router, routed and shared experts
  kLmHead,          // LM head GEMM
  kElementwise,     // memory-bound work outside GEMMs
  kExpertExchange,  // expert-parallel dispatch and combine
  kPipelineWait,    // waiting for a neighbour stage (bubble and transfers)
  kGradReduce,      // exposed gradient reduction (and ZeRO-1 all-gather)
  kOptimizer,       // AdamW, clipping, zeroing gradients
  kCount
};
constexpr int kTimeCategories = static_cast<int>(TimeCategory::kCount);
std::string time_category_name(TimeCategory c);

using Seconds = std::array<double, kTimeCategories>;
double total_seconds(const Seconds& s);

// The fraction of a rank's compute rates it gets when more ranks than cores share a node.
double rank_share(const Rates& rates, const ResolvedLayout& layout);

// Bandwidth and per-message latency between the members of a group whose ranks are `stride`
// apart in a world of `world` ranks (within a node when the group fits in one).
struct Link {
  double bandwidth = 0.0;
  double latency = 0.0;
};
bool group_on_one_node(const Rates& rates, int64_t group_size, int64_t stride, int64_t world);
Link group_link(const Rates& rates, int64_t group_size, int64_t stride, int64_t world);
// The same for a rank of `layout`, whose link bandwidth is shared out with its cores where the
// CPU copies the bytes itself (Rates::async_communication false).
Link group_link(const Rates& rates, const ResolvedLayout& layout, int64_t group_size,
                int64_t stride);

// Forward or backward of one micro-batch of `chunk` on one rank of a stage.
Seconds chunk_pass_seconds(const RunConfig& config, const ResolvedLayout& layout,
                           const ChunkShape& chunk, const Rates& rates, bool forward);

}  // namespace moecore::plan
