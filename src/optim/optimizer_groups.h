// OLMo-core's optimizer parameter groups (its build_groups with group_overrides): group 0 holds
// every trained tensor that no entry of optim.group_overrides names, group k + 1 the tensors
// entry k names. Each group trains with its own lr (the initial_lr its schedule scales, as
// OLMo-core's schedulers scale each group's), weight decay, betas and eps: the entry's where it
// gives them, [optim]'s otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/params.h"
#include "optim/optim_config.h"

namespace moecore {

struct GroupSettings {
  double lr, weight_decay, beta1, beta2, eps;
  bool weight_decay_given;  // the entry's own weight_decay (which no_decay then leaves alone)
};

class OptimizerGroups {
 public:
  // Matches the trained tensors of `layout` (not its buffers, which the optimizer never moves)
  // against the entries' patterns, by moecore's (Hugging Face) name and by OLMo-core's
  // (ParamSpec::olmo_core_name), as Python's fnmatch matches. A tensor two entries name is an
  // error (torch refuses a parameter in two groups). whole_model: `layout` holds every tensor
  // of the model, and a pattern that matches none of them is an error (OLMo-core's strict
  // build); a rank's part of the model may hold none of an entry's tensors.
  OptimizerGroups(const ParamLayout& layout, const OptimConfig& config, bool whole_model = false);

  size_t count() const { return settings_.size(); }
  const GroupSettings& settings(size_t group) const { return settings_[group]; }
  // The group of layout.specs()[spec], and whether AdamW's weight decay applies to it: where its
  // entry gives a weight_decay, always (at that rate, 0 included), else by optim.no_decay.
  size_t group_of(size_t spec) const { return group_of_[spec]; }
  bool decays(size_t spec) const { return decays_[spec] != 0; }

 private:
  std::vector<GroupSettings> settings_;
  std::vector<uint32_t> group_of_;
  std::vector<uint8_t> decays_;
};

}  // namespace moecore
