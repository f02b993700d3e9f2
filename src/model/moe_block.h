// Mixture-of-Experts feed-forward block (dropless token choice):
//   router -> each (token, slot) route is written into a send buffer ordered by destination rank,
//   then expert, then token -> exchange with the ranks holding the experts (expert parallelism;
//   nothing moves on one rank) -> received rows placed expert-major -> grouped SwiGLU GEMM over the
//   local experts -> outputs travel back the same way -> combined with the routing weights at the
//   source -> + optional always-on shared expert.
// The dispatch strategy is one of four, each in its own file with its own cache: local (one
// rank holds every expert: local_dispatch.h), sync (all-to-all: sync_dispatch.h), rowwise
// (one-sided, when the exchange offers it: rowwise_dispatch.h; with the model on a device, the
// sync dispatch's capacity form, which drops the same routes) and rowwise over its padded
// transport (when the exchange offers that: padded_dispatch.h, planned where the routing is).
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "core/device_memory.h"
#include "core/workspace.h"
#include "model/config.h"
#include "model/expert_exchange.h"
#include "model/local_dispatch.h"
#include "model/moe_dispatch.h"
#include "model/padded_dispatch.h"
#include "model/precision_recipe.h"
#include "model/router.h"
#include "model/rowwise_dispatch.h"
#include "model/sync_dispatch.h"

namespace moecore {

// What the forward saves for the backward (and for metrics).
struct MoeCache {
  RouterShape router_shape{};
  RouterState router;
  RoutedRows routed;  // the experts' outputs back at the source
  std::variant<LocalDispatch::Cache, SyncDispatch::Cache, RowwiseDispatch::Cache,
               PaddedDispatch::Cache>
      dispatch;
  DeviceArray<float> shared_gu;       // [N, 2Hs]
  DeviceArray<std::byte> shared_act;  // [N, Hs] in kept_mlp_act_dtype (kSharedExpert)
};

class MoeBlock {
 public:
  // exchange == nullptr: every expert is local.
  MoeBlock(const ModelConfig& config, ExpertShard shard, const ExpertExchange* exchange);
  explicit MoeBlock(const ModelConfig& config)
      : MoeBlock(config, {0, config.num_experts}, nullptr) {}
  MoeBlock(const MoeBlock&) = delete;
  MoeBlock& operator=(const MoeBlock&) = delete;

  // The GEMM precision of the router, the experts and the shared expert (default: fp32).
  void set_precision(const PrecisionRecipe& precision) { precision_ = precision; }

  // x: [N, d] -> y: [N, d] (=). Every rank of the exchange must call it (also with N = 0). The
  // dispatch's temporaries (the sync exchange's send and receive copies) come from `workspace`.
  void forward(const MoeWeights& w, const float* x, int64_t tokens, float* y, MoeCache& cache,
               Workspace& workspace) const;

  // dy: [N, d]; dx: [N, d] (=); parameter gradients in dw (+=). losses: the load-balancing and
  // z-loss gradients for this layer (see RouterGrads). The temporaries (routed rows' gradients, the
  // experts' and the router's) come from `workspace`.
  void backward(const MoeWeights& w, const MoeGrads& dw, const float* x, const float* dy,
                const MoeCache& cache, const RouterLossGradients& losses, float* dx,
                Workspace& workspace) const;

 private:
  using Dispatch = std::variant<LocalDispatch, SyncDispatch, RowwiseDispatch, PaddedDispatch>;
  static Dispatch choose_dispatch(const ModelConfig& config, ExpertShard shard,
                                  const ExpertExchange* exchange);

  const ModelConfig& config_;
  ExpertShard shard_;
  Dispatch dispatch_;
  PrecisionRecipe precision_;
  // bf16 and MXFP8: the experts' fp32 input buffers (act only in MXFP8), swapped into a layer's
  // rows for its forward and back out after it (the backward reads the bf16 or quantised copies),
  // so that one pair serves every layer.
  void lend_fp32_inputs(ExpertRows& rows) const;
  struct LentInputs {
    DeviceArray<float> x, act;
  };
  mutable LentInputs lent_inputs_;
};

}  // namespace moecore
