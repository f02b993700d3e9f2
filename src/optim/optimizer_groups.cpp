#include "optim/optimizer_groups.h"

#include <string>

#include "core/check.h"
#include "core/escape.h"
#include "core/python_fnmatch.h"

namespace moecore {

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

// Whether `pattern` names the tensor: by moecore's name, by OLMo-core's, or by OLMo-core's as its
// OLMoDDP train module sees it (its model parts wrapped in a data-parallel module: "module."
// before every name).
bool pattern_names(const std::string& pattern, const ParamSpec& spec) {
  return python_fnmatch(spec.name, pattern) || python_fnmatch(spec.olmo_core_name, pattern) ||
         python_fnmatch("module." + spec.olmo_core_name, pattern);
}

bool names(const OptimGroupOverride& entry, const ParamSpec& spec) {
  for (const std::string& pattern : entry.params)
    if (pattern_names(pattern, spec)) return true;
  return false;
}

}  // namespace

OptimizerGroups::OptimizerGroups(const ParamLayout& layout, const OptimConfig& config,
                                 bool whole_model) {
  settings_.push_back(
      {config.lr, config.weight_decay, config.beta1, config.beta2, config.eps, false});
  for (const OptimGroupOverride& entry : config.group_overrides)
    settings_.push_back({entry.lr.value_or(config.lr),
                         entry.weight_decay.value_or(config.weight_decay),
                         entry.beta1.value_or(config.beta1), entry.beta2.value_or(config.beta2),
                         entry.eps.value_or(config.eps), entry.weight_decay.has_value()});
  const std::vector<ParamSpec>& specs = layout.specs();
  group_of_.assign(specs.size(), 0);
  decays_.assign(specs.size(), 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    if (spec.is_buffer) continue;  // moved by its own rule, in no group
    for (size_t k = 0; k < config.group_overrides.size(); ++k) {
      if (!names(config.group_overrides[k], spec)) continue;
      MOE_CHECK(group_of_[i] == 0,
                "[config] optim.group_overrides[{}] and optim.group_overrides[{}] both name {} "
                "(OLMo-core's {}): a parameter belongs to one group",
                group_of_[i] - 1, k, escape_for_message(spec.name),
                escape_for_message(spec.olmo_core_name));
      group_of_[i] = static_cast<uint32_t>(k + 1);
    }
    const GroupSettings& group = settings_[group_of_[i]];
    decays_[i] = group.weight_decay_given || takes_weight_decay(spec, config.no_decay);
  }
  if (!whole_model) return;
  for (size_t k = 0; k < config.group_overrides.size(); ++k)
    for (const std::string& pattern : config.group_overrides[k].params) {
      bool matched = false;
      for (const ParamSpec& spec : specs)
        matched = matched || (!spec.is_buffer && pattern_names(pattern, spec));
      MOE_CHECK(
          matched,
          "[config] optim.group_overrides[{}].params: \"{}\" matches no trained parameter "
          "of the model, by its name (model.layers.0.self_attn.q_proj.weight) or "
          "OLMo-core's (blocks.0.attention.w_q.weight, or module.blocks.0.attention.w_q.weight "
          "as its OLMoDDP train module names it)",
          k, escape_for_message(pattern));
    }
}

}  // namespace moecore
