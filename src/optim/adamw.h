// AdamW with decoupled weight decay, exactly torch.optim.AdamW's update (fp32 state):
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State mirrors the parameter spec table (two flat buffers). The parameters optim.no_decay names
// get no weight decay (by default norm gains and embeddings; OLMo-core's AdamW decays every
// parameter its group overrides do not exempt, its own recipes the embeddings). Each optimizer
// group (optim.group_overrides, optim/optimizer_groups.h) has its own lr, decay, betas and eps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "model/params.h"
#include "optim/optim_config.h"
#include "optim/optimizer_groups.h"

namespace moecore {

// The coefficients of step `step` (counted from 1) that change from step to step, at each
// optimizer group's learning rate (group_lrs[g] for group g), where the parameters are, as
// kernels::adamw_update reads them: f32 [3] per group for its tensors with weight decay and for
// those without (kAdamWStepCoefficients' order). The host writes them before the step's work
// (stage), so that a CUDA graph that replays the work follows the schedule.
class AdamWStepCoefficients {
 public:
  void stage(const OptimizerGroups& groups, int64_t step, std::span<const double> group_lrs);
  ConstTensorView of(size_t group, bool decay) const;

 private:
  DeviceArray<float> values_;  // on the default device, as the parameters
};

// The AdamW update of the elements [begin, end) of one parameter group (the whole group, or one
// rank's shard under ZeRO-1) with the staged step_coefficients. params is the group's full flat
// buffer; grads, exp_avg and exp_avg_sq hold just the range (element `begin` is their index 0).
// grad_scale multiplies every gradient as it is read (the gradient-clipping coefficient, fused
// here rather than a separate pass over the gradients; the same float product either way).
// step_factors: the step's decision where the gradients are (kernels::step_decision; its clipping
// coefficient replaces grad_scale, and a skipped step changes nothing), or an empty view.
void adamw_update_range(const ParamLayout& layout, const OptimizerGroups& groups, ParamGroup group,
                        size_t begin, size_t end, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, const AdamWStepCoefficients& step_coefficients,
                        float grad_scale = 1.0f, ConstTensorView step_factors = {});

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const OptimConfig& config);

  // A step in two halves: stage_step counts it and writes its coefficients at each group's
  // learning rate (group_lrs[g], groups().count() of them) where the parameters are (a small copy
  // before the step's work, outside a CUDA graph that replays it); apply_step updates every
  // parameter with gradient grad_scale * `grads` (or as step_factors decide,
  // adamw_update_range). step() does both, at one rate for a config without group overrides.
  void stage_step(std::span<const double> group_lrs);
  void apply_step(ParamBuffers& params, const ParamBuffers& grads, float grad_scale = 1.0f,
                  ConstTensorView step_factors = {});
  void step(ParamBuffers& params, const ParamBuffers& grads, double lr, float grad_scale = 1.0f,
            ConstTensorView step_factors = {}) {
    MOE_CHECK(groups_.count() == 1,
              "[optim] one learning rate for {} optimizer groups (optim.group_overrides)",
              groups_.count());
    stage_step(std::span<const double>(&lr, 1));
    apply_step(params, grads, grad_scale, step_factors);
  }

  const OptimizerGroups& groups() const { return groups_; }

  int64_t steps_taken() const { return step_; }
  ParamBuffers& exp_avg() { return m_; }
  ParamBuffers& exp_avg_sq() { return v_; }
  const ParamBuffers& exp_avg() const { return m_; }
  const ParamBuffers& exp_avg_sq() const { return v_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

 private:
  const ParamLayout& layout_;
  OptimizerGroups groups_;
  ParamBuffers m_, v_;
  int64_t step_ = 0;
  AdamWStepCoefficients step_coefficients_;
};

}  // namespace moecore
