// The parameter spec table (llm.c style): every parameter is a named slice of one of two flat
// buffers. Dense weights and expert weights live in separate buffers because they are reduced over
// different process groups (dense over dp, experts over ep_dp). Gradients, fp32 master weights and
// Adam moments mirror the same two tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "model/config.h"
#include "model/init_rule.h"

namespace moecore {

enum class ParamGroup { kDense, kExpert };

struct ParamSpec {
  std::string name;  // Hugging Face name, e.g. model.layers.0.mlp.experts.3.up_proj.weight
  // The name of the tensor that holds it in OLMo-core's OLMoDDP model, e.g.
  // blocks.0.routed_experts.w_up_gate (every expert's gate and up projections), which its
  // optimizer's group overrides match (optim/optim_groups.h).
  std::string olmo_core_name;
  std::vector<int64_t> shape;
  ParamGroup group;
  size_t offset;  // in elements, into the group's buffer
  size_t numel;
  bool is_norm;       // RMSNorm gains: initialised to 1, no weight decay
  bool is_embedding;  // no weight decay by default
  // Not trained by the optimizer (no gradient, no Adam update, no decay): the router's selection
  // bias, which moves by its own rule after each step (router_bias.h). Initialised to 0.
  bool is_buffer = false;
};

// Where one decoder layer's tensors are in a spec table; nullptr for tensors the layer does not
// have. The expert entries are this layout's first local expert: the start of its [E_local, 2H, d]
// gate/up block and of its [E_local, d, H] down block.
// The two block norms by role, whatever the layout: input_norm is the attention branch's norm and
// post_norm the FFN branch's. Pre-norm (HF OLMoE): input_layernorm before attention,
// post_attention_layernorm before the FFN. Reordered (OLMo-2, HF FlexOlmo):
// post_attention_layernorm after attention, post_feedforward_layernorm after the FFN.
struct LayerSpecs {
  const ParamSpec* input_norm;
  const ParamSpec* q_proj;
  const ParamSpec* k_proj;
  const ParamSpec* v_proj;
  const ParamSpec* o_proj;
  const ParamSpec* q_norm;
  const ParamSpec* k_norm;
  const ParamSpec* post_norm;
  const ParamSpec* mlp_gate;  // dense layers: [I, d], followed in memory by up_proj
  const ParamSpec* mlp_down;
  const ParamSpec* router;
  const ParamSpec* router_bias;  // [E] selection bias (router_bias_update_rate > 0) or nullptr
  const ParamSpec* expert_gate;
  const ParamSpec* expert_down;
  const ParamSpec* shared_gate;  // followed in memory by the shared up_proj
  const ParamSpec* shared_down;
};

// Layers [begin, end) of a pipeline model chunk; end = -1: through the last layer.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = -1;
};

class ParamLayout {
 public:
  // The whole model, or with expert parallelism the part one rank holds: every dense tensor and
  // experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) of each MoE layer (global names).
  // With pipeline parallelism only the layers of `chunks` (the embedding with the chunk starting
  // at layer 0, the final norm and LM head with the one ending at the last layer); empty: all.
  static ParamLayout build(const ModelConfig& config, int64_t ep_size = 1, int64_t ep_rank = 0,
                           const std::vector<LayerRange>& chunks = {});
  // build()'s checks of the placement alone (ep divides the experts, tied embeddings on one
  // stage), without making the table: a big model's has a name for every local expert's tensors.
  static void check_placement(const ModelConfig& config, int64_t ep_size = 1, int64_t ep_rank = 0,
                              const std::vector<LayerRange>& chunks = {});

  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec* find(const std::string& name) const;  // nullptr when absent
  // [begin, end) of the elements of layer `layer` in a group's buffer (a layer's tensors are
  // contiguous); empty when the layer has none in that group.
  std::pair<size_t, size_t> layer_range(ParamGroup group, int64_t layer) const;
  LayerSpecs layer_specs(int64_t layer) const;
  int64_t first_local_expert() const { return first_expert_; }
  int64_t local_experts() const { return local_experts_; }
  size_t numel(ParamGroup group) const {
    return group == ParamGroup::kDense ? dense_numel_ : expert_numel_;
  }

 private:
  // The tensors of one layer (contiguous in specs_; empty for a layer this table does not hold).
  std::span<const ParamSpec> layer_tensors(int64_t layer) const;
  void add(std::string name, std::string olmo_core_name, std::vector<int64_t> shape,
           ParamGroup group, bool is_norm = false, bool is_embedding = false,
           bool is_buffer = false);

  std::vector<ParamSpec> specs_;
  // [first, end) of each layer's tensors in specs_ (empty for a layer this table does not hold).
  std::vector<std::pair<size_t, size_t>> layer_spec_ranges_;
  size_t dense_numel_ = 0;
  size_t expert_numel_ = 0;
  int64_t first_expert_ = 0;
  int64_t local_experts_ = 0;
};

// Owning storage for one copy of all parameters (weights, gradients, moments...), zeroed, on
// `device` (core/device_memory.h; the default device unless given).
struct ParamBuffers {
  DeviceArray<float> dense;
  DeviceArray<float> expert;

  explicit ParamBuffers(const ParamLayout& layout, Device device = default_device())
      : dense(device, layout.numel(ParamGroup::kDense)),
        expert(device, layout.numel(ParamGroup::kExpert)) {}
  // Copies hold their own elements, on the same device.
  ParamBuffers(const ParamBuffers& other)
      : dense(other.dense.clone()), expert(other.expert.clone()) {}
  ParamBuffers& operator=(const ParamBuffers& other) {
    dense = other.dense.clone();
    expert = other.expert.clone();
    return *this;
  }
  ParamBuffers(ParamBuffers&&) noexcept = default;
  ParamBuffers& operator=(ParamBuffers&&) noexcept = default;
  ~ParamBuffers() = default;
  Device device() const { return dense.device(); }
  float* data(ParamGroup group) {
    return group == ParamGroup::kDense ? dense.data() : expert.data();
  }
  const float* data(ParamGroup group) const {
    return group == ParamGroup::kDense ? dense.data() : expert.data();
  }
  float* at(const ParamSpec& spec) { return data(spec.group) + spec.offset; }
  const float* at(const ParamSpec& spec) const { return data(spec.group) + spec.offset; }
  void zero();
};

// Deterministic initialisation: every tensor draws from its own stream seeded by (seed, name), so
// the weights do not depend on the thread count or on the parallel layout. Weights from `init`'s
// rule for a model of `config` (model/init_rule.h), norm gains = 1, buffers (the router's
// selection bias) = 0.
void init_params(const ParamLayout& layout, const ModelConfig& config, const InitOptions& init,
                 uint64_t seed, ParamBuffers& params);
// moecore's rule: every weight ~ N(0, 0.02).
void init_params(const ParamLayout& layout, uint64_t seed, ParamBuffers& params);

}  // namespace moecore
