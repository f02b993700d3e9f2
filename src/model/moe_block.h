// Mixture-of-Experts feed-forward block (dropless token choice):
//   router -> permute (token, slot) routes into an expert-major buffer -> grouped SwiGLU GEMM over
//   that buffer -> combine with the routing weights -> + optional always-on shared expert.
// All buffers are sized once per (tokens, config); no per-expert allocation happens in the hot
// path.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/router.h"

namespace moecore {

// Pointers into the parameter (or gradient) buffers for one MoE layer.
struct MoeWeights {
  float* router;           // [E, d]
  float* experts_gate_up;  // [E, 2H, d]
  float* experts_down;     // [E, d, H]
  float* shared_gate_up;   // [2Hs, d] or nullptr
  float* shared_down;      // [d, Hs] or nullptr
};

// What the forward saves for the backward (and for metrics).
struct MoeCache {
  RouterShape router_shape{};
  RouterState router;
  std::vector<int64_t> expert_offsets;  // [E + 1] row ranges of each expert in the buffers below
  std::vector<int32_t> route_row;       // [N * k] expert-major row of route (t, j)
  std::vector<int32_t> row_token;       // [N * k] token that fills each expert-major row
  std::vector<float> x_perm;            // [N * k, d]
  std::vector<float> gu_perm;           // [N * k, 2H]
  std::vector<float> act_perm;          // [N * k, H]
  std::vector<float> y_perm;            // [N * k, d]
  std::vector<float> shared_gu;         // [N, 2Hs]
  std::vector<float> shared_act;        // [N, Hs]
};

class MoeBlock {
 public:
  explicit MoeBlock(const ModelConfig& config) : config_(config) {}

  // x: [N, d] -> y: [N, d] (=).
  void forward(const MoeWeights& w, const float* x, int64_t tokens, float* y,
               MoeCache& cache) const;

  // dy: [N, d]; dx: [N, d] (=); parameter gradients in dw (+=). lb_score_grad / z_grad_scale: the
  // load-balancing and z-loss gradients for this layer (see RouterGrads).
  void backward(const MoeWeights& w, const MoeWeights& dw, const float* x, const float* dy,
                const MoeCache& cache, const float* lb_score_grad, bool lb_uses_softmax,
                float z_grad_scale, float* dx) const;

 private:
  const ModelConfig& config_;
};

}  // namespace moecore
