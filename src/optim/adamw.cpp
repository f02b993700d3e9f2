#include "optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/ops.h"

namespace moecore {

void AdamWStepCoefficients::stage(const OptimizerGroups& groups, int64_t step,
                                  std::span<const double> group_lrs) {
  MOE_CHECK(group_lrs.size() == groups.count(), "[optim] {} learning rates for {} optimizer groups",
            group_lrs.size(), groups.count());
  const double t = static_cast<double>(step);
  std::vector<float> values;
  values.reserve(2 * kAdamWStepCoefficients * groups.count());
  for (size_t g = 0; g < groups.count(); ++g) {
    const GroupSettings& s = groups.settings(g);
    const double lr = group_lrs[g];
    const float bias1 = static_cast<float>(1.0 - std::pow(s.beta1, t));
    const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, t)));
    const float step_size = static_cast<float>(lr) / bias1;
    const float decay_factor = 1.0f - static_cast<float>(lr * s.weight_decay);
    values.insert(values.end(), {decay_factor, step_size, bias2_sqrt,  // with weight decay
                                 1.0f, step_size, bias2_sqrt});        // without
  }
  values_.resize_for_overwrite(values.size());
  copy_bytes(values_.data(), values.data(), values.size() * sizeof(float));
}

ConstTensorView AdamWStepCoefficients::of(size_t group, bool decay) const {
  MOE_CHECK(!values_.empty(), "[optim] an AdamW update before its step's coefficients were staged");
  const size_t set = 2 * group + (decay ? 0 : 1);
  MOE_CHECK((set + 1) * kAdamWStepCoefficients <= values_.size(),
            "[optim] optimizer group {} has no staged coefficients", group);
  return view(values_.data() + set * kAdamWStepCoefficients, {kAdamWStepCoefficients});
}

void adamw_update_range(const ParamLayout& layout, const OptimizerGroups& groups, ParamGroup group,
                        size_t begin, size_t end, float* params, const float* grads, float* exp_avg,
                        float* exp_avg_sq, const AdamWStepCoefficients& step_coefficients,
                        float grad_scale, ConstTensorView step_factors) {
  // One update per run of adjacent tensors of the same optimizer group and decay: the update is
  // elementwise with the same coefficients inside a run, so a run in one call gives the bits of
  // one call per tensor, with one kernel launch where a GPU would make thousands (a layer's
  // experts are hundreds of tensors, back to back in the expert buffer).
  const auto update = [&](size_t lo, size_t hi, size_t optim_group, bool decay) {
    const GroupSettings& s = groups.settings(optim_group);
    // Placeholders for lr and the bias corrections: the staged step_coefficients replace them.
    const AdamWCoefficients coef{
        1.0f,      static_cast<float>(s.beta1), static_cast<float>(s.beta2),
        1.0f,      static_cast<float>(s.eps),   0.0f,
        grad_scale};
    const int64_t count = static_cast<int64_t>(hi - lo);
    kernels::adamw_update(view(params + lo, {count}), view(grads + (lo - begin), {count}),
                          view(exp_avg + (lo - begin), {count}),
                          view(exp_avg_sq + (lo - begin), {count}), coef,
                          step_coefficients.of(optim_group, decay), step_factors);
  };
  size_t run_lo = 0, run_hi = 0, run_group = 0;
  bool run_decay = false;
  const std::vector<ParamSpec>& specs = layout.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    if (spec.group != group) continue;
    // The part of this tensor inside [begin, end).
    const size_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi || spec.is_buffer) continue;  // buffers move by their own rule
    const size_t optim_group = groups.group_of(i);
    const bool decay = groups.decays(i);
    if (run_hi > run_lo && lo == run_hi && decay == run_decay && optim_group == run_group) {
      run_hi = hi;
      continue;
    }
    if (run_hi > run_lo) update(run_lo, run_hi, run_group, run_decay);
    run_lo = lo;
    run_hi = hi;
    run_group = optim_group;
    run_decay = decay;
  }
  if (run_hi > run_lo) update(run_lo, run_hi, run_group, run_decay);
}

AdamW::AdamW(const ParamLayout& layout, const OptimConfig& config)
    : layout_(layout), groups_(layout, config), m_(layout), v_(layout) {}

void AdamW::stage_step(std::span<const double> group_lrs) {
  ++step_;
  step_coefficients_.stage(groups_, step_, group_lrs);
}

void AdamW::apply_step(ParamBuffers& params, const ParamBuffers& grads, float grad_scale,
                       ConstTensorView step_factors) {
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert})
    adamw_update_range(layout_, groups_, group, 0, layout_.numel(group), params.data(group),
                       grads.data(group), m_.data(group), v_.data(group), step_coefficients_,
                       grad_scale, step_factors);
}

}  // namespace moecore
