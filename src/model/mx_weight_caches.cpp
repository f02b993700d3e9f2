#include "model/mx_weight_caches.h"

#include "core/check.h"

namespace moecore {

std::vector<MxWeightRange> mx_weight_ranges(const ModelConfig& c, const ParamLayout& layout,
                                            LayerRange layers, const PrecisionRecipe& recipe) {
  std::vector<MxWeightRange> ranges;
  auto add = [&](bool mx, const ParamSpec* spec, int64_t batch, int64_t out, int64_t in) {
    if (!mx || spec == nullptr) return;
    MOE_CHECK(out % mx::kMxBlock == 0 && in % mx::kMxBlock == 0,
              "[mxfp8] {} is [{}, {}]: MXFP8 quantises both of its dimensions in blocks of {} "
              "(train.precision = \"mxfp8\" needs multiples of {})",
              spec->name, out, in, mx::kMxBlock, mx::kMxBlock);
    ranges.push_back({spec->group, spec->offset, batch, out, in});
  };
  const int64_t d = c.hidden_size;
  const int64_t h = c.moe_intermediate_size, local = layout.local_experts();
  const int64_t end = layers.end < 0 ? c.num_hidden_layers : layers.end;
  for (int64_t i = layers.begin; i < end; ++i) {
    const LayerSpecs s = layout.layer_specs(i);
    add(recipe.mx.attention, s.q_proj, 1, c.q_size(), d);
    add(recipe.mx.attention, s.k_proj, 1, c.kv_size(), d);
    add(recipe.mx.attention, s.v_proj, 1, c.kv_size(), d);
    add(recipe.mx.attention, s.o_proj, 1, d, c.q_size());
    add(recipe.mx.dense_mlp, s.mlp_gate, 1, 2 * c.intermediate_size, d);  // gate and up
    add(recipe.mx.dense_mlp, s.mlp_down, 1, d, c.intermediate_size);
    add(recipe.mx.dense_mlp, s.shared_gate, 1, 2 * c.shared_expert_intermediate_size, d);
    add(recipe.mx.dense_mlp, s.shared_down, 1, d, c.shared_expert_intermediate_size);
    add(recipe.mx.experts, s.expert_gate, local, 2 * h, d);
    add(recipe.mx.experts, s.expert_down, local, d, h);
  }
  return ranges;
}

size_t mx_cache_bytes(const MxWeightRange& range) {
  const auto numel = static_cast<size_t>(range.batch * range.out * range.in);
  return 2 * (numel + numel / mx::kMxBlock);
}

namespace {

// The two caches of `r` laid out from `p`: along in (codes, scales), then along out.
struct MxCacheViews {
  TensorView in_codes, in_scales, out_codes, out_scales;
};

MxCacheViews cache_views(uint8_t* p, const MxWeightRange& r) {
  const int64_t b = r.batch, out = r.out, in = r.in, blk = mx::kMxBlock, numel = b * out * in;
  return {TensorView(p, {b, out, in}, DType::kE4m3),
          TensorView(p + numel, {b, out, in / blk}, DType::kE8m0),
          TensorView(p + numel + numel / blk, {b, in, out}, DType::kE4m3),
          TensorView(p + 2 * numel + numel / blk, {b, in, out / blk}, DType::kE8m0)};
}

}  // namespace

MxWeightCaches::MxWeightCaches(std::vector<MxWeightRange> ranges, mx::ScaleMode scale_mode)
    : scale_mode_(scale_mode) {
  size_t total = 0;
  for (const MxWeightRange& range : ranges) total += mx_cache_bytes(range);
  bytes_.resize(total);
  size_t offset = 0;
  for (const MxWeightRange& range : ranges) {
    const MxCacheViews v = cache_views(bytes_.data() + offset, range);
    caches_.push_back(
        {range, offset, {{v.in_codes, v.in_scales}, {v.out_codes, v.out_scales}, scale_mode}});
    offset += mx_cache_bytes(range);
  }
}

void MxWeightCaches::refresh(const ParamBuffers& params) {
  for (const Cache& cache : caches_) {
    const MxWeightRange& r = cache.range;
    const ConstTensorView fp32(params.data(r.group) + r.begin, {r.batch, r.out, r.in}, DType::kF32);
    const MxCacheViews v = cache_views(bytes_.data() + cache.offset, r);
    kernels::mx_quantize(fp32, scale_mode_, v.in_codes, v.in_scales);
    kernels::mx_quantize_transposed(fp32, scale_mode_, v.out_codes, v.out_scales);
  }
}

const MxWeight* MxWeightCaches::find(ParamGroup group, size_t begin) const {
  for (const Cache& cache : caches_)
    if (cache.range.group == group && cache.range.begin == begin) return &cache.weight;
  return nullptr;
}

}  // namespace moecore
