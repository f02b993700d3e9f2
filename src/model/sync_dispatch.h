// The `sync` MoE dispatch over an expert-parallel group (DESIGN.md, "Parallelism"): an
// all-to-all of per-expert counts, an all-to-all-v of the token rows (send order: destination
// rank, then expert, then token), a receive-side permutation into expert-major order, the grouped
// experts, and the reverse path for the outputs. The backward retraces it with the gradients.
//
// The capacity form is the `rowwise` dispatch where its windows cannot reach the rows (device
// memory: MPI's windows are host memory): the rowwise exchange's keep decision by blocks
// (RowwiseExchange::blocks) replaces the all-to-all of counts, only the kept routes travel (the
// first of each expert's routes in token order), and the dropped ones get zero output and zero
// gradient. The experts see the rowwise buffer's rows in its order (local expert, then source,
// then token), so the results equal the window form's bit for bit.
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
    // The capacity form's kept routes, when it dropped any: [routes sent] the send-order row of
    // each (planned on the host from the counts, copied to where the rows are); else empty.
    std::vector<int32_t> kept_rows_plan;
    DeviceArray<int32_t> kept_rows;
    int64_t dropped_routes = 0;  // this rank's routes the capacity dropped
  };

  // capacity: the rowwise exchange whose keep decision limits what travels (the capacity form),
  // or nullptr (every route travels).
  SyncDispatch(const ModelConfig& config, ExpertShard shard, const ExpertExchange& exchange,
               const RowwiseExchange* capacity = nullptr)
      : config_(config), shard_(shard), exchange_(exchange), capacity_(capacity) {}

  // x: [N, d] -> routed (send_pos, y_back); what the backward needs into cache; the send and
  // receive copies from `workspace`. Collective over the group (also with N = 0).
  // The experts multiply as `precision` says (its experts and mx entries).
  void forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
               int64_t tokens, const RouterState& router, RoutedRows& routed, Cache& cache,
               Workspace& workspace) const;
  // dy_send: [N * k, d] output gradients in send order -> dx_send (=), same order, zero for
  // dropped routes; expert weight gradients += into dw. Collective.
  void backward(const PrecisionRecipe& precision, const MoeWeights& w, const MoeGrads& dw,
                const Cache& cache, const float* dy_send, float* dx_send,
                Workspace& workspace) const;

 private:
  const ModelConfig& config_;
  ExpertShard shard_;
  const ExpertExchange& exchange_;
  const RowwiseExchange* capacity_;
};

}  // namespace moecore
