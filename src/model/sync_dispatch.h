// The `sync` MoE dispatch over an expert-parallel group (DESIGN.md, "Parallelism"): an
// all-to-all of per-expert counts, an all-to-all-v of the token rows (send order: destination
// rank, then expert, then token), a receive-side permutation into expert-major order, the grouped
// experts, and the reverse path for the outputs. The backward retraces it with the gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "core/workspace.h"
#include "model/config.h"
#include "model/expert_exchange.h"
#include "model/grouped_experts.h"
#include "model/moe_dispatch.h"
#include "model/precision_recipe.h"

namespace moecore {

class SyncDispatch {
 public:
  struct Cache {
    std::vector<int64_t> send_rows;    // [ranks] rows sent to each rank
    std::vector<int64_t> recv_counts;  // [ranks * E_local] rows received per (source, expert)
    std::vector<int64_t> recv_rows;    // [ranks] rows received from each rank
    // [R] expert-major row of each received row: planned on the host from the exchanged counts,
    // copied to where the rows are for the permutations.
    std::vector<int32_t> recv_to_expert_plan;
    DeviceArray<int32_t> recv_to_expert;
    ExpertRows experts;         // the received rows, expert-major
    DeviceArray<float> y_perm;  // [R, d] expert outputs, expert-major
  };

  SyncDispatch(const ModelConfig& config, ExpertShard shard, const ExpertExchange& exchange)
      : config_(config), shard_(shard), exchange_(exchange) {}

  // x: [N, d] -> routed (send_pos, y_back); what the backward needs into cache; the send and
  // receive copies from `workspace`. Collective over the group (also with N = 0).
  // The experts multiply as `precision` says (its experts and mx entries).
  void forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
               int64_t tokens, const RouterState& router, RoutedRows& routed, Cache& cache,
               Workspace& workspace) const;
  // dy_send: [N * k, d] output gradients in send order -> dx_send (=), same order; expert weight
  // gradients += into dw. Collective.
  void backward(const PrecisionRecipe& precision, const MoeWeights& w, const MoeGrads& dw,
                const Cache& cache, const float* dy_send, float* dx_send,
                Workspace& workspace) const;

 private:
  const ModelConfig& config_;
  ExpertShard shard_;
  const ExpertExchange& exchange_;
};

}  // namespace moecore
