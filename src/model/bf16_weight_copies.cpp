#include "model/bf16_weight_copies.h"

#include "core/check.h"
#include "kernels/ops.h"

namespace moecore {

std::vector<ParamRange> bf16_copy_ranges(const ModelConfig& c, const ParamLayout& layout,
                                         LayerRange layers, const PrecisionRecipe& recipe) {
  using Precision = PrecisionRecipe::Precision;
  std::vector<ParamRange> ranges;
  // MX modules (all three GEMMs of an MXFP8 linear; an MXFP8 expert's weight gradient) read MX
  // caches or no weight: nothing to copy.
  auto copy = [&](Precision module, const ParamSpec* spec, int64_t numel, bool mx = false) {
    if (module == Precision::kBf16 && spec != nullptr && !mx)
      ranges.push_back({spec->group, spec->offset, static_cast<size_t>(numel)});
  };
  const int64_t d = c.hidden_size, local = layout.local_experts();
  const int64_t end = layers.end < 0 ? c.num_hidden_layers : layers.end;
  for (int64_t i = layers.begin; i < end; ++i) {
    const LayerSpecs s = layout.layer_specs(i);
    for (const ParamSpec* projection : {s.q_proj, s.k_proj, s.v_proj, s.o_proj})
      copy(recipe.attention, projection, static_cast<int64_t>(projection->numel),
           recipe.mx.attention);
    const bool mx_dense = mx_swiglu_mlp(recipe.mx, SwigluMlp::kDenseLayer);
    const bool mx_shared = mx_swiglu_mlp(recipe.mx, SwigluMlp::kSharedExpert);
    copy(recipe.dense_mlp, s.mlp_gate, 2 * c.intermediate_size * d, mx_dense);  // gate and up
    copy(recipe.dense_mlp, s.mlp_down, c.intermediate_size * d, mx_dense);
    copy(recipe.dense_mlp, s.shared_gate, 2 * c.shared_expert_intermediate_size * d, mx_shared);
    copy(recipe.dense_mlp, s.shared_down, c.shared_expert_intermediate_size * d, mx_shared);
    copy(recipe.experts, s.expert_gate, local * 2 * c.moe_intermediate_size * d, recipe.mx.experts);
    copy(recipe.experts, s.expert_down, local * c.moe_intermediate_size * d, recipe.mx.experts);
  }
  if (end == c.num_hidden_layers)
    copy(recipe.lm_head,
         layout.find(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"),
         c.vocab_size * d);
  return ranges;
}

Bf16WeightCopies::Bf16WeightCopies(std::vector<ParamRange> ranges) {
  size_t total = 0;
  for (const ParamRange& range : ranges) {
    for (const Copy& other : copies_)
      MOE_CHECK(other.range.group != range.group ||
                    range.begin + range.numel <= other.range.begin ||
                    other.range.begin + other.range.numel <= range.begin,
                "[bf16 copies] overlapping ranges at element {}", range.begin);
    copies_.push_back({range, total});
    total += range.numel;
  }
  bits_.resize(total);
}

void Bf16WeightCopies::refresh(const ParamBuffers& params) {
  for (const Copy& copy : copies_) {
    const auto numel = static_cast<int64_t>(copy.range.numel);
    kernels::to_bf16(view(params.data(copy.range.group) + copy.range.begin, {numel}),
                     TensorView(bits_.data() + copy.offset, {numel}, DType::kBf16));
  }
}

const uint16_t* Bf16WeightCopies::find(ParamGroup group, size_t begin, size_t numel) const {
  for (const Copy& copy : copies_)
    if (copy.range.group == group && begin >= copy.range.begin &&
        begin + numel <= copy.range.begin + copy.range.numel)
      return bits_.data() + copy.offset + (begin - copy.range.begin);
  return nullptr;
}

}  // namespace moecore
