// AdamW with decoupled weight decay, exactly torch.optim.AdamW's update (fp32 state):
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State mirrors the parameter spec table (two flat buffers). Norm gains and embeddings get no
// weight decay (the OLMo-core default).
#pragma once

#include <cstdint>

#include "model/params.h"
#include "optim/optim_config.h"

namespace moecore {

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const OptimConfig& config);

  // One update of every parameter with gradient `grads` (already clipped) at learning rate lr.
  void step(ParamBuffers& params, const ParamBuffers& grads, double lr);

  int64_t steps_taken() const { return step_; }
  ParamBuffers& exp_avg() { return m_; }
  ParamBuffers& exp_avg_sq() { return v_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  const ParamLayout& layout_;
  OptimConfig config_;
  ParamBuffers m_, v_;
  int64_t step_ = 0;
};

}  // namespace moecore
