#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace moecore {

void adamw_update_range(const ParamLayout& layout, const OptimConfig& config, ParamGroup group,
                        size_t begin, size_t end, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, int64_t step, double lr, float grad_scale,
                        ConstTensorView step_factors) {
  const double t = static_cast<double>(step);
  const float b1 = static_cast<float>(config.beta1), b2 = static_cast<float>(config.beta2);
  const float bias1 = static_cast<float>(1.0 - std::pow(config.beta1, t));
  const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, t)));
  const float eps = static_cast<float>(config.eps);
  const float step_size = static_cast<float>(lr) / bias1;
  // One update per run of adjacent tensors with the same decay: the update is elementwise with
  // the same coefficients inside a run, so a run in one call gives the bits of one call per tensor,
  // with one kernel launch where a GPU would make thousands (a layer's experts are hundreds of
  // tensors, back to back in the expert buffer).
  const auto update = [&](size_t lo, size_t hi, bool decay) {
    const float decay_factor = decay ? 1.0f - static_cast<float>(lr * config.weight_decay) : 1.0f;
    const int64_t count = static_cast<int64_t>(hi - lo);
    const AdamWCoefficients coef{decay_factor, b1, b2, bias2_sqrt, eps, step_size, grad_scale};
    kernels::adamw_update(view(params + lo, {count}), view(grads + (lo - begin), {count}),
                          view(exp_avg + (lo - begin), {count}),
                          view(exp_avg_sq + (lo - begin), {count}), coef, step_factors);
  };
  size_t run_lo = 0, run_hi = 0;
  bool run_decay = false;
  for (const ParamSpec& spec : layout.specs()) {
    if (spec.group != group) continue;
    // The part of this tensor inside [begin, end).
    const size_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi || spec.is_buffer) continue;  // buffers move by their own rule
    const bool decay = !spec.is_norm && !spec.is_embedding;
    if (run_hi > run_lo && lo == run_hi && decay == run_decay) {
      run_hi = hi;
      continue;
    }
    if (run_hi > run_lo) update(run_lo, run_hi, run_decay);
    run_lo = lo;
    run_hi = hi;
    run_decay = decay;
  }
  if (run_hi > run_lo) update(run_lo, run_hi, run_decay);
}

AdamW::AdamW(const ParamLayout& layout, const OptimConfig& config)
    : layout_(layout), config_(config), m_(layout), v_(layout) {}

void AdamW::step(ParamBuffers& params, const ParamBuffers& grads, double lr, float grad_scale,
                 ConstTensorView step_factors) {
  ++step_;
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert})
    adamw_update_range(layout_, config_, group, 0, layout_.numel(group), params.data(group),
                       grads.data(group), m_.data(group), v_.data(group), step_, lr, grad_scale,
                       step_factors);
}

}  // namespace moecore
