// The `rowwise` MoE dispatch (OLMo-core's production design, DESIGN.md "Parallelism"): routes
// keep route order at the source; each kept route's row is written straight into its expert-major
// row at the destination (one-sided puts into symmetric buffers), the experts compute in place,
// and each route's output is fetched back. Routes beyond the destination's capacity are dropped
// (zero output, zero gradient) and counted. The backward reuses the same buffers.
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

class RowwiseDispatch {
 public:
  struct Cache {
    std::vector<RowTarget> targets;  // [N * k] where each route's row went
    int64_t dropped_routes = 0;      // this rank's routes dropped by the capacity
    ExpertRows experts;              // x: a copy of the input buffer's rows
  };

  RowwiseDispatch(const ModelConfig& config, ExpertShard shard, const RowwiseExchange& exchange)
      : config_(config), shard_(shard), exchange_(exchange) {}

  // x: [N, d] -> routed (send_pos: the identity, y_back: route order); collective over the group
  // (also with N = 0). No temporaries: rows travel through the exchange's symmetric buffers (the
  // workspace parameter keeps the three dispatches' signatures alike).
  // The experts multiply as `precision` says (its experts and mx entries).
  void forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
               int64_t tokens, const RouterState& router, RoutedRows& routed, Cache& cache,
               Workspace& workspace) const;
  // dy_send: [N * k, d] output gradients in route order -> dx_send (=), zero for dropped routes;
  // expert weight gradients += into dw. Collective.
  void backward(const PrecisionRecipe& precision, const MoeWeights& w, const MoeGrads& dw,
                const Cache& cache, const float* dy_send, float* dx_send,
                Workspace& workspace) const;

 private:
  const ModelConfig& config_;
  ExpertShard shard_;
  const RowwiseExchange& exchange_;
};

}  // namespace moecore
