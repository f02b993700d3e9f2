// The MoE dispatch when one rank holds every expert: the send order (by expert, then token) is
// already the experts' expert-major input order, so token rows are gathered straight into the
// expert inputs and the outputs are read in place; nothing is exchanged or permuted again.
#pragma once

#include <cstdint>
#include <vector>

#include "core/workspace.h"
#include "model/config.h"
#include "model/grouped_experts.h"
#include "model/moe_dispatch.h"
#include "model/precision_recipe.h"

namespace moecore {

class LocalDispatch {
 public:
  struct Cache {
    ExpertRows experts;  // expert-major rows: those of route r at routed.send_pos[r]
  };

  explicit LocalDispatch(const ModelConfig& config) : config_(config) {}

  // x: [N, d] -> routed (send_pos, y_back); the experts' rows into cache (no temporaries: the
  // workspace parameter keeps the three dispatches' signatures alike).
  // The experts multiply as `precision` says (its experts and mx entries).
  void forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
               int64_t tokens, const RouterState& router, RoutedRows& routed, Cache& cache,
               Workspace& workspace) const;
  // dy_send: [N * k, d] output gradients in send order -> dx_send (=), same order; expert weight
  // gradients += into dw; temporaries from `workspace`.
  void backward(const PrecisionRecipe& precision, const MoeWeights& w, const MoeGrads& dw,
                const Cache& cache, const float* dy_send, float* dx_send,
                Workspace& workspace) const;

 private:
  const ModelConfig& config_;
};

}  // namespace moecore
