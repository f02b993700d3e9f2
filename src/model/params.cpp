#include "model/params.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/fill_normal.h"

namespace moecore {

namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

// FNV-1a: a stable hash of the parameter name for per-tensor seeds.
uint64_t hash_name(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Whether chunks (empty: all layers) hold the embedding, and the LM head.
std::pair<bool, bool> holds_embedding_and_head(const ModelConfig& c,
                                               const std::vector<LayerRange>& chunks) {
  bool has_embedding = chunks.empty(), has_head = chunks.empty();
  for (const LayerRange& r : chunks) {
    has_embedding = has_embedding || r.begin == 0;
    has_head = has_head || r.end < 0 || r.end == c.num_hidden_layers;
  }
  return {has_embedding, has_head};
}

}  // namespace

void ParamLayout::add(std::string name, std::string olmo_core_name, std::vector<int64_t> shape,
                      ParamGroup group, bool is_norm, bool is_embedding, bool is_buffer) {
  const size_t numel = static_cast<size_t>(product(shape));
  size_t& cursor = group == ParamGroup::kDense ? dense_numel_ : expert_numel_;
  specs_.push_back({std::move(name), std::move(olmo_core_name), std::move(shape), group, cursor,
                    numel, is_norm, is_embedding, is_buffer});
  cursor += numel;
}

void ParamLayout::check_placement(const ModelConfig& c, int64_t ep_size, int64_t ep_rank,
                                  const std::vector<LayerRange>& chunks) {
  c.validate();
  MOE_CHECK(ep_size >= 1 && c.num_experts % ep_size == 0 && ep_rank >= 0 && ep_rank < ep_size,
            "[parallel] parallel.ep={} does not divide num_experts={}", ep_size, c.num_experts);
  const auto [has_embedding, has_head] = holds_embedding_and_head(c, chunks);
  MOE_CHECK(!(c.tie_word_embeddings && has_embedding != has_head),
            "[parallel] tie_word_embeddings=true needs the embedding and the LM head on one "
            "pipeline stage (use untied embeddings with parallel.pp > 1)");
}

// The order below is also the memory order; forward/backward code relies on these adjacencies:
//   * a dense MLP's (or shared expert's) gate_proj is immediately followed by its up_proj, so the
//     pair is one [2I, d] matrix and gate/up are computed by a single GEMM;
//   * a MoE layer's experts are stored expert-major, gate_e then up_e for e = 0..E-1 (one
//     [E, 2H, d] tensor), then every down_e (one [E, d, H] tensor), ready for a grouped GEMM.
ParamLayout ParamLayout::build(const ModelConfig& c, int64_t ep_size, int64_t ep_rank,
                               const std::vector<LayerRange>& chunks) {
  check_placement(c, ep_size, ep_rank, chunks);
  ParamLayout layout;
  layout.local_experts_ = c.num_experts / ep_size;
  layout.first_expert_ = ep_rank * layout.local_experts_;
  const int64_t first = layout.first_expert_, last = first + layout.local_experts_;
  const int64_t d = c.hidden_size;
  const auto dense = ParamGroup::kDense;
  const int64_t total = c.num_hidden_layers;
  auto held = [&](int64_t layer) {
    if (chunks.empty()) return true;
    for (const LayerRange& r : chunks)
      if (layer >= r.begin && layer < (r.end < 0 ? total : r.end)) return true;
    return false;
  };
  const auto [has_embedding, has_head] = holds_embedding_and_head(c, chunks);
  if (has_embedding)
    layout.add("model.embed_tokens.weight", "embeddings.weight", {c.vocab_size, d}, dense, false,
               true);
  // One layer's tensors, in memory order (added one after the other: contiguous in specs_), with
  // OLMo-core's names in its OLMoDDP model: the norms by role (attention_norm, feed_forward_norm),
  // a dense layer's MLP as its shared_experts, the experts' projections fused (w_up_gate holds
  // up and gate, w_down the down projections).
  auto add_layer = [&](int64_t i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string o = "blocks." + std::to_string(i) + ".";
    const bool reordered = c.block_norm == BlockNorm::kReordered;
    // The attention branch's norm, under its Hugging Face name for the block layout.
    layout.add(p + (reordered ? "post_attention_layernorm.weight" : "input_layernorm.weight"),
               o + "attention_norm.weight", {d}, dense, true);
    layout.add(p + "self_attn.q_proj.weight", o + "attention.w_q.weight", {c.q_size(), d}, dense);
    layout.add(p + "self_attn.k_proj.weight", o + "attention.w_k.weight", {c.kv_size(), d}, dense);
    layout.add(p + "self_attn.v_proj.weight", o + "attention.w_v.weight", {c.kv_size(), d}, dense);
    layout.add(p + "self_attn.o_proj.weight", o + "attention.w_out.weight", {d, c.q_size()}, dense);
    if (c.qk_norm != QkNorm::kNone) {
      const int64_t q = c.qk_norm == QkNorm::kFull ? c.q_size() : c.head_size();
      const int64_t k = c.qk_norm == QkNorm::kFull ? c.kv_size() : c.head_size();
      layout.add(p + "self_attn.q_norm.weight", o + "attention.q_norm.weight", {q}, dense, true);
      layout.add(p + "self_attn.k_norm.weight", o + "attention.k_norm.weight", {k}, dense, true);
    }
    // The FFN branch's norm.
    layout.add(
        p + (reordered ? "post_feedforward_layernorm.weight" : "post_attention_layernorm.weight"),
        o + "feed_forward_norm.weight", {d}, dense, true);
    if (c.layer_is_dense(i)) {
      layout.add(p + "mlp.gate_proj.weight", o + "shared_experts.w_up_gate",
                 {c.intermediate_size, d}, dense);
      layout.add(p + "mlp.up_proj.weight", o + "shared_experts.w_up_gate", {c.intermediate_size, d},
                 dense);
      layout.add(p + "mlp.down_proj.weight", o + "shared_experts.w_down", {d, c.intermediate_size},
                 dense);
      return;
    }
    layout.add(p + "mlp.gate.weight", o + "routed_experts_router.weight", {c.num_experts, d},
               dense);
    // DeepSeek-V3's name for the selection bias (also Dots1's and GLM-4-MoE's).
    if (c.has_router_bias())
      layout.add(p + "mlp.gate.e_score_correction_bias", o + "routed_experts_router.score_bias",
                 {c.num_experts}, dense, false, false, true);
    const int64_t h = c.moe_intermediate_size;
    for (int64_t e = first; e < last; ++e) {
      const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
      layout.add(pe + "gate_proj.weight", o + "routed_experts.w_up_gate", {h, d},
                 ParamGroup::kExpert);
      layout.add(pe + "up_proj.weight", o + "routed_experts.w_up_gate", {h, d},
                 ParamGroup::kExpert);
    }
    for (int64_t e = first; e < last; ++e) {
      const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
      layout.add(pe + "down_proj.weight", o + "routed_experts.w_down", {d, h}, ParamGroup::kExpert);
    }
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t hs = c.shared_expert_intermediate_size;
      layout.add(p + "mlp.shared_expert.gate_proj.weight", o + "shared_experts.w_up_gate", {hs, d},
                 dense);
      layout.add(p + "mlp.shared_expert.up_proj.weight", o + "shared_experts.w_up_gate", {hs, d},
                 dense);
      layout.add(p + "mlp.shared_expert.down_proj.weight", o + "shared_experts.w_down", {d, hs},
                 dense);
    }
  };
  layout.layer_spec_ranges_.assign(static_cast<size_t>(total), {0, 0});
  for (int64_t i = 0; i < total; ++i) {
    if (!held(i)) continue;
    const size_t layer_first_spec = layout.specs_.size();
    add_layer(i);
    layout.layer_spec_ranges_[static_cast<size_t>(i)] = {layer_first_spec, layout.specs_.size()};
  }
  if (has_head) {
    layout.add("model.norm.weight", "lm_head.norm.weight", {d}, dense, true);
    if (!c.tie_word_embeddings)
      layout.add("lm_head.weight", "lm_head.w_out.weight", {c.vocab_size, d}, dense);
  }
  return layout;
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  auto it = std::find_if(specs_.begin(), specs_.end(),
                         [&](const ParamSpec& spec) { return spec.name == name; });
  return it == specs_.end() ? nullptr : &*it;
}

std::span<const ParamSpec> ParamLayout::layer_tensors(int64_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layer_spec_ranges_.size()) return {};
  const auto [first, end] = layer_spec_ranges_[static_cast<size_t>(layer)];
  return std::span<const ParamSpec>(specs_).subspan(first, end - first);
}

std::pair<size_t, size_t> ParamLayout::layer_range(ParamGroup group, int64_t layer) const {
  size_t begin = SIZE_MAX, end = 0;
  for (const ParamSpec& spec : layer_tensors(layer)) {
    if (spec.group != group) continue;
    begin = std::min(begin, spec.offset);
    end = std::max(end, spec.offset + spec.numel);
  }
  return begin == SIZE_MAX ? std::pair<size_t, size_t>{0, 0}
                           : std::pair<size_t, size_t>{begin, end};
}

LayerSpecs ParamLayout::layer_specs(int64_t layer) const {
  // Looked up among the layer's own tensors only: a big model's table has tens of thousands, and
  // the planner asks for every layer's of each layout it tries.
  const std::span<const ParamSpec> tensors = layer_tensors(layer);
  auto find_in_layer = [&](const std::string& name) -> const ParamSpec* {
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [&](const ParamSpec& spec) { return spec.name == name; });
    return it == tensors.end() ? nullptr : &*it;
  };
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string expert = p + "mlp.experts." + std::to_string(first_expert_) + ".";
  // Reordered blocks have no input_layernorm; their norms follow the sublayers (see LayerSpecs).
  const bool reordered = find_in_layer(p + "input_layernorm.weight") == nullptr &&
                         find_in_layer(p + "post_feedforward_layernorm.weight") != nullptr;
  return {
      find_in_layer(p + (reordered ? "post_attention_layernorm.weight" : "input_layernorm.weight")),
      find_in_layer(p + "self_attn.q_proj.weight"),
      find_in_layer(p + "self_attn.k_proj.weight"),
      find_in_layer(p + "self_attn.v_proj.weight"),
      find_in_layer(p + "self_attn.o_proj.weight"),
      find_in_layer(p + "self_attn.q_norm.weight"),
      find_in_layer(p + "self_attn.k_norm.weight"),
      find_in_layer(p + (reordered ? "post_feedforward_layernorm.weight"
                                   : "post_attention_layernorm.weight")),
      find_in_layer(p + "mlp.gate_proj.weight"),
      find_in_layer(p + "mlp.down_proj.weight"),
      find_in_layer(p + "mlp.gate.weight"),
      find_in_layer(p + "mlp.gate.e_score_correction_bias"),
      find_in_layer(expert + "gate_proj.weight"),
      find_in_layer(expert + "down_proj.weight"),
      find_in_layer(p + "mlp.shared_expert.gate_proj.weight"),
      find_in_layer(p + "mlp.shared_expert.down_proj.weight")};
}

void ParamBuffers::zero() {
  dense.zero();
  expert.zero();
}

void init_params(const ParamLayout& layout, const ModelConfig& config, const InitOptions& init,
                 uint64_t seed, ParamBuffers& params) {
  if (params.device() != Device::kCpu) {
    // Drawn on the host, then copied where the parameters live.
    ParamBuffers host(layout, Device::kCpu);
    init_params(layout, config, init, seed, host);
    copy_bytes(params.dense.data(), host.dense.data(), host.dense.size() * sizeof(float));
    copy_bytes(params.expert.data(), host.expert.data(), host.expert.size() * sizeof(float));
    return;
  }
  // Each weight from its own stream (seeded by the run's seed and the weight's name): the same
  // values in any layout, on any number of threads.
  std::vector<kernels::NormalFill> weights;
  for (const ParamSpec& spec : layout.specs()) {
    float* w = params.at(spec);
    if (spec.is_buffer) {
      std::fill(w, w + spec.numel, 0.0f);
    } else if (spec.is_norm) {
      std::fill(w, w + spec.numel, 1.0f);
    } else {
      const InitDistribution dist = init_distribution(config, init, spec);
      weights.push_back({w, spec.numel, seed * 0x9E3779B97F4A7C15ull ^ hash_name(spec.name),
                         static_cast<float>(dist.std), dist.truncated});
    }
  }
  kernels::fill_normal(weights);
}

void init_params(const ParamLayout& layout, uint64_t seed, ParamBuffers& params) {
  // moecore's rule reads nothing of the model's shape.
  init_params(layout, ModelConfig{}, InitOptions{}, seed, params);
}

}  // namespace moecore
