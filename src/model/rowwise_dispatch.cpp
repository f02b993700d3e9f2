#include "model/rowwise_dispatch.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/phase_timer.h"
#include "core/to_size.h"

namespace moecore {

void RowwiseDispatch::forward(const PrecisionRecipe& precision, const MoeWeights& w, const float* x,
                              int64_t tokens, const RouterState& router, RoutedRows& routed,
                              Cache& cache, Workspace& /*workspace*/) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t routes = tokens * k, local = shard_.count;
  ScopedPhase timer(Phase::kDispatchForward);
  // Buffers at the source stay in route order; the plan says where each route's row goes.
  // The plan reads the routing on the host and the exchange moves host rows (MPI windows); with
  // the model on a device MoeBlock runs the sync dispatch's capacity form instead.
  MOE_CHECK(router.topk_index.device() == Device::kCpu && routed.send_pos.device() == Device::kCpu,
            "[moe] the rowwise dispatch's windows reach host memory only (a model on a device "
            "runs its capacity form, model/sync_dispatch.h)");
  routed.send_pos.resize(to_size(routes));
  int32_t* send_pos = routed.send_pos.data();  // host memory, as checked above
  for (int64_t r = 0; r < routes; ++r) send_pos[r] = static_cast<int32_t>(r);
  RowwisePlan plan =
      exchange_.plan(host_copy(router.expert_counts), router.topk_index.data(), routes, local, d);
  cache.targets = std::move(plan.targets);
  cache.experts.set_offsets(plan.expert_offsets);
  cache.dropped_routes = plan.dropped;

  // Token rows straight into the destinations' expert-major input buffers; ours is then complete.
  exchange_.put_rows(x, k, cache.targets, d);
  const int64_t received = cache.experts.received;
  const float* x_in = exchange_.input();
  float* y_out = exchange_.output();
  // The backward needs the inputs after later layers have reused the buffer: a plain copy (in
  // bf16 and mxfp8 into the buffer MoeBlock lends, for the forward alone: the experts keep their
  // own bf16 or MX copies).
  cache.experts.x.resize(to_size(received * d));
  copy_bytes(cache.experts.x.data(), x_in, to_size(received * d) * sizeof(float));
  timer.switch_to(Phase::kExpertsForward);
  grouped_experts_forward(precision, config_, local, w, cache.experts, y_out);
  timer.switch_to(Phase::kCombineForward);
  // Each kept route's output fetched from its destination; dropped routes contribute zero.
  routed.y_back.resize(to_size(routes * d));
  routed.y_back.zero();
  exchange_.get_rows(routed.y_back.data(), cache.targets, d);
}

void RowwiseDispatch::backward(const PrecisionRecipe& precision, const MoeWeights& w,
                               const MoeGrads& dw, const Cache& cache, const float* dy_send,
                               float* dx_send, Workspace& workspace) const {
  const int64_t d = config_.hidden_size;
  const int64_t local = shard_.count;
  // Output gradients go to the rows their routes used in the forward; the experts' backward runs
  // in place (dy from the input buffer, dx into the output buffer), and each kept route fetches
  // its input gradient back. Dropped routes get none.
  ScopedPhase timer(Phase::kDispatchBackward);
  exchange_.put_rows(dy_send, 1, cache.targets, d);
  const float* dy_in = exchange_.input();
  float* dx_out = exchange_.output();
  timer.switch_to(Phase::kExpertsBackward);
  grouped_experts_backward(precision, config_, local, w, dw, cache.experts, dy_in, dx_out,
                           workspace);
  timer.switch_to(Phase::kCombineBackward);
  std::fill_n(dx_send, static_cast<int64_t>(cache.targets.size()) * d, 0.0f);
  exchange_.get_rows(dx_send, cache.targets, d);
}

}  // namespace moecore
