// AdamW with decoupled weight decay, exactly torch.optim.AdamW's update (fp32 state):
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State mirrors the parameter spec table (two flat buffers). Norm gains and embeddings get no
// weight decay (the OLMo-core default).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor_view.h"
#include "model/params.h"
#include "optim/optim_config.h"

namespace moecore {

// The AdamW update of the elements [begin, end) of one parameter group (the whole group, or one
// rank's shard under ZeRO-1). params is the group's full flat buffer; grads, exp_avg and
// exp_avg_sq hold just the range (element `begin` is their index 0). `step` counts from 1.
// grad_scale multiplies every gradient as it is read (the gradient-clipping coefficient, fused
// here rather than a separate pass over the gradients; the same float product either way).
// step_factors: the step's decision where the gradients are (kernels::step_decision; its clipping
// coefficient replaces grad_scale, and a skipped step changes nothing), or an empty view.
void adamw_update_range(const ParamLayout& layout, const OptimConfig& config, ParamGroup group,
                        size_t begin, size_t end, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, int64_t step, double lr, float grad_scale = 1.0f,
                        ConstTensorView step_factors = {});

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const OptimConfig& config);

  // One update of every parameter with gradient grad_scale * `grads` at learning rate lr (or
  // as step_factors decide, adamw_update_range).
  void step(ParamBuffers& params, const ParamBuffers& grads, double lr, float grad_scale = 1.0f,
            ConstTensorView step_factors = {});

  int64_t steps_taken() const { return step_; }
  ParamBuffers& exp_avg() { return m_; }
  ParamBuffers& exp_avg_sq() { return v_; }
  const ParamBuffers& exp_avg() const { return m_; }
  const ParamBuffers& exp_avg_sq() const { return v_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  const ParamLayout& layout_;
  OptimConfig config_;
  ParamBuffers m_, v_;
  int64_t step_ = 0;
};

}  // namespace moecore
