// Mixture-of-Experts feed-forward block (dropless token choice):
//   router -> each (token, slot) route is written into a send buffer ordered by destination rank,
//   then expert, then token -> exchange with the ranks holding the experts (expert parallelism;
//   nothing moves on one rank) -> received rows placed expert-major -> grouped SwiGLU GEMM over the
//   local experts -> outputs travel back the same way -> combined with the routing weights at the
//   source -> + optional always-on shared expert.
// With one rank the send buffer is already expert-major; the same code runs in both cases.
// When the exchange offers the `rowwise` dispatch (ExpertExchange::rowwise()), routes instead keep
// route order at the source: each kept route's row is written straight into its expert-major row at
// the destination, the experts compute in place, and outputs are fetched back per route; routes
// beyond the destination's capacity are dropped (zero output, zero gradient) and counted.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/expert_exchange.h"
#include "model/router.h"

namespace moecore {

// Pointers into the parameter (or gradient) buffers for one MoE layer.
struct MoeWeights {
  float* router;                 // [E, d] (every expert: routing is replicated)
  float* experts_gate_up;        // [E_local, 2H, d] this rank's experts
  float* experts_down;           // [E_local, d, H]
  float* shared_gate_up;         // [2Hs, d] or nullptr
  float* shared_down;            // [d, Hs] or nullptr
  float* router_bias = nullptr;  // [E] selection bias (aux-loss-free balancing) or nullptr; it
                                 // gets no gradient (it is not a function of the loss)
};

// This rank's experts: global ids [first, first + count); count * exchange.ranks() == E.
struct ExpertShard {
  int64_t first = 0;
  int64_t count = 0;
};

// What the forward saves for the backward (and for metrics).
struct MoeCache {
  RouterShape router_shape{};
  RouterState router;
  std::vector<int32_t> send_pos;        // [N * k] row of route (t, j) in the send buffers
                                        // (rowwise: the identity, buffers in route order)
  std::vector<RowTarget> targets;       // rowwise: [N * k] where each route's row went
  int64_t dropped_routes = 0;           // rowwise: this rank's routes dropped by the capacity
  std::vector<int64_t> send_rows;       // [ranks] rows sent to each rank
  std::vector<int64_t> recv_counts;     // [ranks * E_local] rows received per (source, expert)
  std::vector<int64_t> recv_rows;       // [ranks] rows received from each rank
  std::vector<int64_t> expert_offsets;  // [E_local + 1] row ranges of local experts, expert-major
  std::vector<int32_t> recv_to_expert;  // [R] expert-major row of each received row
  std::vector<float> x_perm;            // [R, d] expert inputs, expert-major
                                        // (rowwise: a copy of the input buffer's rows)
  std::vector<float> gu_perm;           // [R, 2H]
  std::vector<float> act_perm;          // [R, H]
  std::vector<float> y_perm;            // [R, d] expert outputs, expert-major (sync only)
  std::vector<float> y_back;            // [N * k, d] expert outputs back at the source, send order
                                        // (rows of dropped routes are zero)
  std::vector<float> shared_gu;         // [N, 2Hs]
  std::vector<float> shared_act;        // [N, Hs]
};

class MoeBlock {
 public:
  // exchange == nullptr: every expert is local.
  MoeBlock(const ModelConfig& config, ExpertShard shard, const ExpertExchange* exchange);
  explicit MoeBlock(const ModelConfig& config)
      : MoeBlock(config, {0, config.num_experts}, nullptr) {}
  // exchange_ may point at local_: a MoeBlock stays where it was built.
  MoeBlock(const MoeBlock&) = delete;
  MoeBlock& operator=(const MoeBlock&) = delete;

  // x: [N, d] -> y: [N, d] (=). Every rank of the exchange must call it (also with N = 0).
  void forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
               MoeCache& cache) const;

  // dy: [N, d]; dx: [N, d] (=); parameter gradients in dw (+=). lb_score_grad / z_grad_scale: the
  // load-balancing and z-loss gradients for this layer (see RouterGrads).
  void backward(const MoeWeights& w, const MoeWeights& dw, const float* x, const float* dy,
                const MoeCache& cache, const float* lb_score_grad, bool lb_uses_softmax,
                float z_grad_scale, float* dx) const;

 private:
  // The expert part of forward and backward for each dispatch: fill cache.y_back (forward); turn
  // dy_send (send order) into dx_send (send order) and add expert weight gradients (backward).
  void experts_forward_sync(const MoeWeights& w, const float* x, int64_t tokens,
                            MoeCache& cache) const;
  void experts_forward_rowwise(const MoeWeights& w, const float* x, int64_t tokens,
                               MoeCache& cache) const;
  // The sync dispatch when one rank holds every expert (no exchange, no second permutation).
  void experts_forward_single_rank(const MoeWeights& w, const float* x, int64_t tokens,
                                   const std::vector<int64_t>& expert_ends, MoeCache& cache) const;
  void experts_backward_sync(const MoeWeights& w, const MoeWeights& dw, const MoeCache& cache,
                             const std::vector<float>& dy_send, std::vector<float>& dx_send) const;
  void experts_backward_rowwise(const MoeWeights& w, const MoeWeights& dw, const MoeCache& cache,
                                const std::vector<float>& dy_send,
                                std::vector<float>& dx_send) const;

  const ModelConfig& config_;
  ExpertShard shard_;
  LocalExchange local_;
  const ExpertExchange* exchange_;
  const RowwiseExchange* rowwise_;  // exchange_->rowwise(): nullptr for the sync dispatch
};

}  // namespace moecore
