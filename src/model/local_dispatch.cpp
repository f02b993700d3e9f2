#include "model/local_dispatch.h"

#include "core/phase_timer.h"
#include "kernels/ops.h"

namespace moecore {

void LocalDispatch::forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
                            int64_t tokens, const RouterState& router, RoutedRows& routed,
                            Cache& cache, Workspace& /*workspace*/) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t routes = tokens * k, e_count = c.num_experts;
  ScopedPhase timer(Phase::kDispatchForward);
  ExpertRows& rows = cache.experts;
  routed.send_pos.resize(static_cast<size_t>(routes));
  rows.expert_offsets.resize(static_cast<size_t>(e_count + 1));
  kernels::order_routes_by_expert(view(router.topk_index.data(), {tokens, k}), e_count,
                                  view(routed.send_pos.data(), {routes}),
                                  view(rows.expert_offsets.data(), {e_count + 1}));
  // Every route has a local expert: the rows are known without reading the offsets.
  rows.received = routes;
  rows.x.resize(static_cast<size_t>(routes * d));
  kernels::permute_rows(view(x, {tokens, d}), view(routed.send_pos.data(), {routes}), k,
                        view(rows.x.data(), {routes, d}));
  timer.switch_to(Phase::kExpertsForward);
  routed.y_back.resize(static_cast<size_t>(routes * d));
  grouped_experts_forward(precision, config_, e_count, w, rows, routed.y_back.data());
}

void LocalDispatch::backward(const PrecisionRecipe& precision, const MoeWeights& w,
                             const MoeGrads& dw, const Cache& cache, const float* dy_send,
                             float* dx_send, Workspace& workspace) const {
  // Send order is expert order: the experts' backward reads the output gradients and writes the
  // input gradients in place.
  const ScopedPhase timer(Phase::kExpertsBackward);
  grouped_experts_backward(precision, config_, config_.num_experts, w, dw, cache.experts, dy_send,
                           dx_send, workspace);
}

}  // namespace moecore
