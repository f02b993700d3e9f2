#include "optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/check.h"
#include "kernels/ops.h"

namespace moecore {

void AdamWStepCoefficients::stage(const OptimConfig& config, int64_t step, double lr) {
  const double t = static_cast<double>(step);
  const float bias1 = static_cast<float>(1.0 - std::pow(config.beta1, t));
  const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, t)));
  const float step_size = static_cast<float>(lr) / bias1;
  const float decay_factor = 1.0f - static_cast<float>(lr * config.weight_decay);
  const std::array<float, 2 * kAdamWStepCoefficients> values = {
      decay_factor, step_size, bias2_sqrt,   // with weight decay
      1.0f,         step_size, bias2_sqrt};  // without
  values_.resize_for_overwrite(values.size());
  copy_bytes(values_.data(), values.data(), sizeof(values));
}

ConstTensorView AdamWStepCoefficients::of(bool decay) const {
  MOE_CHECK(!values_.empty(), "[optim] an AdamW update before its step's coefficients were staged");
  return view(values_.data() + (decay ? 0 : kAdamWStepCoefficients), {kAdamWStepCoefficients});
}

namespace {

// Whether optim.no_decay leaves the tensor to weight decay.
bool takes_weight_decay(const ParamSpec& spec, NoDecay no_decay) {
  switch (no_decay) {
    case NoDecay::kNone:
      return true;
    case NoDecay::kEmbeddings:
      return !spec.is_embedding;
    case NoDecay::kNormsAndEmbeddings:
      return !spec.is_norm && !spec.is_embedding;
  }
  return true;
}

}  // namespace

void adamw_update_range(const ParamLayout& layout, const OptimConfig& config, ParamGroup group,
                        size_t begin, size_t end, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, const AdamWStepCoefficients& step_coefficients,
                        float grad_scale, ConstTensorView step_factors) {
  const float b1 = static_cast<float>(config.beta1), b2 = static_cast<float>(config.beta2);
  const float eps = static_cast<float>(config.eps);
  // Placeholders: the staged step_coefficients replace them.
  const AdamWCoefficients coef{1.0f, b1, b2, 1.0f, eps, 0.0f, grad_scale};
  // One update per run of adjacent tensors with the same decay: the update is elementwise with
  // the same coefficients inside a run, so a run in one call gives the bits of one call per tensor,
  // with one kernel launch where a GPU would make thousands (a layer's experts are hundreds of
  // tensors, back to back in the expert buffer).
  const auto update = [&](size_t lo, size_t hi, bool decay) {
    const int64_t count = static_cast<int64_t>(hi - lo);
    kernels::adamw_update(view(params + lo, {count}), view(grads + (lo - begin), {count}),
                          view(exp_avg + (lo - begin), {count}),
                          view(exp_avg_sq + (lo - begin), {count}), coef,
                          step_coefficients.of(decay), step_factors);
  };
  size_t run_lo = 0, run_hi = 0;
  bool run_decay = false;
  for (const ParamSpec& spec : layout.specs()) {
    if (spec.group != group) continue;
    // The part of this tensor inside [begin, end).
    const size_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi || spec.is_buffer) continue;  // buffers move by their own rule
    const bool decay = takes_weight_decay(spec, config.no_decay);
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

void AdamW::stage_step(double lr) {
  ++step_;
  step_coefficients_.stage(config_, step_, lr);
}

void AdamW::apply_step(ParamBuffers& params, const ParamBuffers& grads, float grad_scale,
                       ConstTensorView step_factors) {
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert})
    adamw_update_range(layout_, config_, group, 0, layout_.numel(group), params.data(group),
                       grads.data(group), m_.data(group), v_.data(group), step_coefficients_,
                       grad_scale, step_factors);
}

}  // namespace moecore
