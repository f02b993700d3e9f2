#include "model/mx_weight_caches.h"

#include "core/check.h"

namespace moecore {

namespace {

// One dimension of a weight as the config sets it.
struct ConfigDim {
  int64_t size;
  const char* key;  // the config key that sets it
};

}  // namespace

std::vector<MxWeightRange> mx_weight_ranges(const ModelConfig& c, const ParamLayout& layout,
                                            LayerRange layers, const PrecisionRecipe& recipe) {
  std::vector<MxWeightRange> ranges;
  // A weight [out, in] as the checkpoint holds it: `fused` of them stacked along out make the
  // range (gate_proj and up_proj as one [2H, d]), so the error names the checkpoint's tensor with
  // its own shape, and the config key of a dimension that is not whole blocks.
  auto add = [&](bool mx, const ParamSpec* spec, int64_t batch, ConfigDim out, ConfigDim in,
                 bool mx_weight_grad, int64_t fused = 1) {
    if (!mx || spec == nullptr) return;
    for (const ConfigDim& dim : {out, in})
      MOE_CHECK(dim.size % mx::kMxBlock == 0,
                "[mxfp8] {} is [{}, {}]: MXFP8 quantises both of its dimensions in blocks of {}, "
                "and {} = {} is not a multiple of {} (train.precision = \"mxfp8\" needs "
                "multiples of {})",
                spec->name, out.size, in.size, mx::kMxBlock, dim.key, dim.size, mx::kMxBlock,
                mx::kMxBlock);
    ranges.push_back({spec->group, spec->offset, batch, fused * out.size, in.size, mx_weight_grad});
  };
  const ConfigDim d{c.hidden_size, "model.hidden_size"};
  const ConfigDim q{c.q_size(), "model.num_attention_heads x model.head_dim"};
  const ConfigDim kv{c.kv_size(), "model.num_key_value_heads x model.head_dim"};
  const ConfigDim dense_h{c.intermediate_size, "model.intermediate_size"};
  const ConfigDim shared_h{c.shared_expert_intermediate_size,
                           "model.shared_expert_intermediate_size"};
  const ConfigDim h{c.moe_intermediate_size, "model.moe_intermediate_size"};
  const int64_t local = layout.local_experts();
  const int64_t end = layers.end < 0 ? c.num_hidden_layers : layers.end;
  const MxRecipe& mx = recipe.mx;
  for (int64_t i = layers.begin; i < end; ++i) {
    const LayerSpecs s = layout.layer_specs(i);
    add(mx.attention, s.q_proj, 1, q, d, true);
    add(mx.attention, s.k_proj, 1, kv, d, true);
    add(mx.attention, s.v_proj, 1, kv, d, true);
    add(mx.attention, s.o_proj, 1, d, q, true);
    add(mx.dense_mlp, s.mlp_gate, 1, dense_h, d, true, 2);  // gate and up
    add(mx.dense_mlp, s.mlp_down, 1, d, dense_h, true);
    add(mx.experts, s.shared_gate, 1, shared_h, d, mx.expert_wgrad, 2);
    add(mx.experts, s.shared_down, 1, d, shared_h, mx.expert_wgrad);
    add(mx.experts, s.expert_gate, local, h, d, mx.expert_wgrad, 2);
    add(mx.experts, s.expert_down, local, d, h, mx.expert_wgrad);
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
    caches_.push_back({range,
                       offset,
                       {{v.in_codes, v.in_scales},
                        {v.out_codes, v.out_scales},
                        scale_mode,
                        range.mx_weight_grad}});
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
