// The `rowwise` MoE dispatch over a padded all-to-all (model/expert_exchange.h's PaddedExchange):
// the transport for rows that no symmetric window reaches, planned where the routing is so that
// no pass waits for the host. The routers' counts are all-gathered where they are; each rank
// plans its part of the rowwise keep decision on its device (kernels' padded_dispatch_plan) and
// gathers its kept routes' rows into static blocks, one per destination; one all-to-all moves
// the blocks; each destination gathers the rows into its expert-major buffer of `capacity` rows
// (local expert, then source, then token: the window transport's order, so the experts compute
// the same bits), runs the experts on it (rows past those kept are neither read nor written by
// the GEMMs), and the outputs travel back the same way. Dropped routes get zero output and zero
// gradient, as with the windows. The backward retraces it with the gradients.
// Nothing here reads the device: the drop count stays there until the step's metrics read it.
#pragma once

#include <cstdint>

#include "core/device_memory.h"
#include "core/workspace.h"
#include "model/config.h"
#include "model/expert_exchange.h"
#include "model/grouped_experts.h"
#include "model/moe_dispatch.h"
#include "model/precision_recipe.h"

namespace moecore {

class PaddedDispatch {
 public:
  struct Cache {
    // kernels/ops.h's PaddedDispatchMaps (positions: the send order, routed.send_pos).
    DeviceArray<int32_t> slot_of_position, position_of_slot, token_of_slot;
    DeviceArray<int32_t> row_of_slot, slot_of_row;
    DeviceArray<int64_t> dropped;  // [1] this rank's routes the capacity dropped
    ExpertRows experts;            // capacity rows; expert_offsets end at the rows kept
    DeviceArray<float> y_perm;     // [capacity, d] expert outputs, expert-major
  };

  PaddedDispatch(const ModelConfig& config, ExpertShard shard, const ExpertExchange& exchange,
                 const PaddedExchange& padded)
      : config_(config), shard_(shard), exchange_(exchange), padded_(padded) {}

  // x: [N, d] -> routed (send_pos: the send order, by expert; y_back in that order, zero rows for
  // dropped routes); the maps and the experts' rows into cache; the blocks from `workspace`.
  // Collective over the group (also with N = 0, on every rank).
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
  const PaddedExchange& padded_;
};

}  // namespace moecore
