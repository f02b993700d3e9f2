#include "model/init_rule.h"

#include <cmath>
#include <string>

#include "core/check.h"
#include "model/params.h"

namespace moecore {

namespace {

// What OLMo-core's init tells apart, read from the Hugging Face name.
enum class WeightRole {
  kEmbedding,
  kLmHead,
  kAttentionInput,   // q, k, v
  kAttentionOutput,  // o
  kRouter,
  kExpertInput,   // a routed expert's gate and up
  kExpertOutput,  // a routed expert's down
  kSharedMlp,     // a shared expert's or a dense layer's three (OLMo-core's shared_experts)
};

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

WeightRole role_of(const std::string& name) {
  if (name == "model.embed_tokens.weight") return WeightRole::kEmbedding;
  if (name == "lm_head.weight") return WeightRole::kLmHead;
  if (ends_with(name, "self_attn.o_proj.weight")) return WeightRole::kAttentionOutput;
  if (name.find(".self_attn.") != std::string::npos) return WeightRole::kAttentionInput;
  if (ends_with(name, "mlp.gate.weight")) return WeightRole::kRouter;
  if (name.find(".mlp.experts.") != std::string::npos)
    return ends_with(name, "down_proj.weight") ? WeightRole::kExpertOutput
                                               : WeightRole::kExpertInput;
  MOE_CHECK(name.find(".mlp.") != std::string::npos, "[model] no initialisation rule for '{}'",
            name);
  return WeightRole::kSharedMlp;
}

int64_t layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  MOE_CHECK(name.rfind(prefix, 0) == 0, "[model] '{}' is not a layer's tensor", name);
  return std::stoll(name.substr(prefix.size()));
}

}  // namespace

InitDistribution init_distribution(const ModelConfig& config, const InitOptions& options,
                                   const ParamSpec& spec) {
  // Tied, the one matrix is the embedding's: OLMo-core's training builds its model on the meta
  // device, initialises embedding and head apart and re-ties the head to the embedding.
  const WeightRole role = role_of(spec.name);
  const double std = options.std;
  const double embedding_std = options.embedding_std > 0.0 ? options.embedding_std : std;
  const double d = static_cast<double>(config.hidden_size);
  switch (options.method) {
    case InitMethod::kMoecore:
      return {role == WeightRole::kEmbedding ? embedding_std : std, false};
    case InitMethod::kNormal:
      return {role == WeightRole::kEmbedding ? embedding_std : std, true};
    case InitMethod::kLlama:
    case InitMethod::kLlamaDepth: {
      if (role == WeightRole::kEmbedding) return {1.0, false};
      if (role == WeightRole::kLmHead) return {1.0 / std::sqrt(d), true};
      if (role == WeightRole::kAttentionInput) return {std, true};
      // The attention's output and every tensor of the MoE (or dense) block.
      const double depth = options.method == InitMethod::kLlama
                               ? static_cast<double>(config.num_hidden_layers)
                               : static_cast<double>(layer_of(spec.name) + 1);
      return {std / std::sqrt(2.0 * depth), true};
    }
    case InitMethod::kFanIn: {
      if (role == WeightRole::kEmbedding) return {1.0, false};
      if (role == WeightRole::kSharedMlp) return {std, true};
      // [out, in] matrices: the fan-in is the second dimension (the LM head's and the router's
      // d_model, the output projection's q_size, a routed expert's down its hidden size).
      return {1.0 / std::sqrt(static_cast<double>(spec.shape.at(1))), true};
    }
  }
  return {std, false};
}

}  // namespace moecore
