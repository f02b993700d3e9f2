#include "plan/param_count.h"

#include <string>

#include "model/params.h"

namespace moecore::plan {

namespace {

bool contains(const std::string& name, const char* part) {
  return name.find(part) != std::string::npos;
}

}  // namespace

ParamCounts count_params(const ModelConfig& c) {
  const ParamLayout layout = ParamLayout::build(c);
  ParamCounts p;
  for (const ParamSpec& spec : layout.specs()) {
    const int64_t n = static_cast<int64_t>(spec.numel);
    const std::string& name = spec.name;
    if (name == "model.embed_tokens.weight")
      p.embedding += n;
    else if (name == "lm_head.weight")
      p.lm_head += n;
    else if (contains(name, ".self_attn."))
      p.attention += n;
    else if (spec.is_norm)
      p.norms += n;
    else if (contains(name, ".mlp.experts."))
      p.routed_experts += n;
    else if (contains(name, ".mlp.shared_expert."))
      p.shared_experts += n;
    else if (contains(name, ".mlp.gate.weight"))
      p.routers += n;
    else
      p.dense_mlp += n;
  }
  p.total =
      static_cast<int64_t>(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert));
  // Integer arithmetic: E divides every layer's expert count exactly.
  p.active = p.total - p.routed_experts +
             (c.num_experts > 0 ? p.routed_experts / c.num_experts * c.num_experts_per_tok : 0);
  return p;
}

}  // namespace moecore::plan
