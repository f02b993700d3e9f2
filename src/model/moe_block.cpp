#include "model/moe_block.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "core/check.h"
#include "core/phase_timer.h"
#include "core/to_size.h"
#include "kernels/ops.h"
#include "model/swiglu_mlp.h"

namespace moecore {

MoeBlock::Dispatch MoeBlock::choose_dispatch(const ModelConfig& config, ExpertShard shard,
                                             const ExpertExchange* exchange) {
  // The rowwise dispatch's padded transport runs wherever the model is.
  if (exchange != nullptr && exchange->padded() != nullptr)
    return PaddedDispatch(config, shard, *exchange, *exchange->padded());
  // The rowwise dispatch's windows are host memory: with the model on a device, its keep
  // decision drives the sync dispatch's all-to-all-v instead (the capacity form).
  if (exchange != nullptr && exchange->rowwise() != nullptr) {
    if (default_device() == Device::kCpu)
      return RowwiseDispatch(config, shard, *exchange->rowwise());
    return SyncDispatch(config, shard, *exchange, exchange->rowwise());
  }
  if (exchange != nullptr && exchange->ranks() > 1) return SyncDispatch(config, shard, *exchange);
  return LocalDispatch(config);
}

MoeBlock::MoeBlock(const ModelConfig& config, ExpertShard shard, const ExpertExchange* exchange)
    : config_(config), shard_(shard), dispatch_(choose_dispatch(config, shard, exchange)) {
  const int64_t ranks = exchange != nullptr ? exchange->ranks() : 1;
  const int64_t rank = exchange != nullptr ? exchange->rank() : 0;
  MOE_CHECK(shard_.count * ranks == config.num_experts && shard_.first == rank * shard_.count,
            "[moe] {} ranks holding {} experts each (from {}) do not cover num_experts={}", ranks,
            shard_.count, shard_.first, config.num_experts);
}

void MoeBlock::lend_fp32_inputs(ExpertRows& rows) const {
  rows.x.swap(lent_inputs_.x);
  rows.act.swap(lent_inputs_.act);
}

void MoeBlock::forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
                       MoeCache& cache, Workspace& workspace) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  cache.router_shape = router_shape_of(c, tokens);
  cache.router_shape.precision = precision_.router;
  cache.router.selection.bias = w.router_bias;
  ScopedPhase timer(Phase::kRouterForward);
  router_forward(cache.router_shape, x, w.router, cache.router);
  timer.stop();  // the dispatch paths time their own phases
  std::visit(
      [&](const auto& dispatch) {
        using Cache = typename std::decay_t<decltype(dispatch)>::Cache;
        if (!std::holds_alternative<Cache>(cache.dispatch)) cache.dispatch.emplace<Cache>();
        ExpertRows& rows = std::get<Cache>(cache.dispatch).experts;
        // bf16 and MXFP8 keep the experts' inputs rounded or quantised (ExpertRows): their fp32
        // buffers are lent for the forward only, from one pair this block reuses for every layer
        // and micro-batch.
        const bool lend = kept_expert_inputs(precision_) != KeptExpertInputs::kFp32;
        if (lend) lend_fp32_inputs(rows);
        dispatch.forward(precision_, w, x, tokens, cache.router, cache.routed,
                         std::get<Cache>(cache.dispatch), workspace);
        if (lend) lend_fp32_inputs(rows);
      },
      dispatch_);

  const int64_t hs = c.shared_expert_intermediate_size;
  timer.switch_to(Phase::kSharedExpertForward);
  if (hs > 0) {
    const DType act_type = kept_mlp_act_dtype(precision_, SwigluMlp::kSharedExpert);
    cache.shared_gu.resize(to_size(tokens * 2 * hs));
    cache.shared_act.resize(to_size(tokens * hs) * dtype_size(act_type));
    swiglu_mlp_forward(precision_.dense_mlp, {tokens, d, hs}, x, w.shared_gate_up, w.shared_down,
                       cache.shared_gu.data(),
                       TensorView(cache.shared_act.data(), {tokens, hs}, act_type), y);
  } else {
    zero_bytes(y, static_cast<size_t>(tokens * d) * sizeof(float));
  }
  // Combine: y[t] += sum_j weight[t, j] * output of route (t, j).
  timer.switch_to(Phase::kCombineForward);
  kernels::moe_combine_forward(view(cache.routed.y_back.data(), {tokens * k, d}),
                               view(cache.routed.send_pos.data(), {tokens, k}),
                               view(cache.router.topk_weight.data(), {tokens, k}),
                               view(y, {tokens, d}));
}

void MoeBlock::backward(const MoeWeights& w, const MoeGrads& dw, const float* x, const float* dy,
                        const MoeCache& cache, const RouterLossGradients& losses, float* dx,
                        Workspace& workspace) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, k = c.num_experts_per_tok;
  const int64_t tokens = cache.router_shape.tokens, routes = tokens * k;

  // Combine backward at the source: d output(t, j) = weight * dy[t]; d weight = <dy[t], output>.
  ScopedPhase timer(Phase::kCombineBackward);
  Workspace::Scope scratch(workspace);
  const std::span<float> dy_send = scratch.zeroed<float>(routes * d);
  const std::span<float> d_weight = scratch.zeroed<float>(routes);
  kernels::moe_combine_backward(
      view(dy, {tokens, d}), view(cache.routed.y_back.data(), {routes, d}),
      view(cache.routed.send_pos.data(), {tokens, k}),
      view(cache.router.topk_weight.data(), {tokens, k}), view(dy_send.data(), {routes, d}),
      view(d_weight.data(), {tokens, k}));

  const std::span<float> dx_send = scratch.zeroed<float>(routes * d);
  timer.stop();  // the dispatch paths time their own phases
  std::visit(
      [&](const auto& dispatch) {
        using Cache = typename std::decay_t<decltype(dispatch)>::Cache;
        dispatch.backward(precision_, w, dw, std::get<Cache>(cache.dispatch), dy_send.data(),
                          dx_send.data(), workspace);
      },
      dispatch_);
  timer.switch_to(Phase::kCombineBackward);
  kernels::permute_rows_backward(view(dx_send.data(), {routes, d}),
                                 view(cache.routed.send_pos.data(), {routes}), k,
                                 view(dx, {tokens, d}));

  const int64_t hs = c.shared_expert_intermediate_size;
  timer.switch_to(Phase::kSharedExpertBackward);
  if (hs > 0) {
    const DType act_type = kept_mlp_act_dtype(precision_, SwigluMlp::kSharedExpert);
    const std::span<float> shared_dact = scratch.zeroed<float>(tokens * hs);
    // Written in full by the SwiGLU's backward.
    const std::span<std::byte> shared_dgu = scratch.uninitialized<std::byte>(
        tokens * 2 * hs * static_cast<int64_t>(dtype_size(act_type)));
    swiglu_mlp_backward(precision_.dense_mlp, {tokens, d, hs}, dy, x, w.shared_gate_up,
                        w.shared_down, cache.shared_gu.data(),
                        ConstTensorView(cache.shared_act.data(), {tokens, hs}, act_type), dx,
                        dw.shared_gate_up, dw.shared_down, shared_dact.data(),
                        TensorView(shared_dgu.data(), {tokens, 2 * hs}, act_type), true);
  }

  timer.switch_to(Phase::kRouterBackward);
  router_backward(cache.router_shape, x, w.router, cache.router, {d_weight.data(), losses}, dx,
                  dw.router, workspace);
}

}  // namespace moecore
