#include "model/inference.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/host_memory.h"
#include "kernels/ops.h"
#include "kernels/serial_scope.h"
#include "model/linear.h"
#include "model/swiglu_mlp.h"

namespace moecore {

// The fp32 weights: a bf16 recipe converts the weight operands per call here (decoding reads
// each weight once per token; the weights may change between generations during training).
struct InferenceModel::LayerWeights {
  const float* input_norm;
  ConstTensorView q_proj;  // [nh*hd, d]
  ConstTensorView k_proj;  // [nkv*hd, d]
  ConstTensorView v_proj;  // [nkv*hd, d]
  ConstTensorView o_proj;  // [d, nh*hd]
  const float* q_norm;     // [nh*hd] (full), [hd] (per_head) or nullptr
  const float* k_norm;
  const float* post_norm;
  ConstTensorView mlp_gate_up;  // dense layers: [2I, d] (gate_proj then up_proj)
  ConstTensorView mlp_down;     // [d, I]
  MoeWeights moe;               // MoE layers
};

namespace {

// Below this many multiply-adds a forward call runs on one thread: a small model's decode step is
// dominated by fork/join and barrier costs (which explode on a loaded machine), not arithmetic.
constexpr int64_t kSerialMacs = int64_t{1} << 21;

void add_in_place(float* x, const float* y, int64_t count) {
  kernels::add(view(x, {count}), view(y, {count}), view(x, {count}));
}

}  // namespace

InferenceModel::InferenceModel(const ModelConfig& config, const ParamLayout& layout,
                               const ParamBuffers& params, int64_t max_seq)
    : config_(config), params_(params), moe_(config_) {
  config_.validate();
  const ModelConfig& c = config_;
  MOE_CHECK(max_seq > 0, "[inference] max_seq={} must be positive", max_seq);
  MOE_CHECK(params.dense.size() == layout.numel(ParamGroup::kDense) &&
                params.expert.size() == layout.numel(ParamGroup::kExpert),
            "[inference] parameter buffers ({} dense, {} expert floats) do not match the layout "
            "({} dense, {} expert)",
            params.dense.size(), params.expert.size(), layout.numel(ParamGroup::kDense),
            layout.numel(ParamGroup::kExpert));
  MOE_CHECK(params.device() == default_device(),
            "[inference] the weights are in {} memory but the model's scratch would be in {} "
            "memory (the default device)",
            device_name(params.device()), device_name(default_device()));
  auto need = [&](const std::string& name) -> const float* {
    const ParamSpec* spec = layout.find(name);
    MOE_CHECK(spec != nullptr, "[inference] parameter {} is missing from the layout", name);
    return params.at(*spec);
  };
  embed_ = need("model.embed_tokens.weight");
  final_norm_ = need("model.norm.weight");
  lm_head_ = c.tie_word_embeddings ? embed_ : need("lm_head.weight");
  auto at = [&](const ParamSpec* spec) -> const float* {
    return spec == nullptr ? nullptr : params.at(*spec);
  };
  auto matrix = [&](const ParamSpec* spec, std::initializer_list<int64_t> shape) {
    return spec == nullptr ? ConstTensorView{}
                           : ConstTensorView(params.at(*spec), shape, DType::kF32);
  };
  const int64_t d = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t width = c.intermediate_size, h = c.moe_intermediate_size;
  const int64_t hs = c.shared_expert_intermediate_size, experts = layout.local_experts();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerSpecs s = layout.layer_specs(i);
    LayerWeights w{};
    w.input_norm = at(s.input_norm);
    w.q_proj = matrix(s.q_proj, {qs, d});
    w.k_proj = matrix(s.k_proj, {kvs, d});
    w.v_proj = matrix(s.v_proj, {kvs, d});
    w.o_proj = matrix(s.o_proj, {d, qs});
    w.q_norm = at(s.q_norm);
    w.k_norm = at(s.k_norm);
    w.post_norm = at(s.post_norm);
    w.mlp_gate_up = matrix(s.mlp_gate, {2 * width, d});
    w.mlp_down = matrix(s.mlp_down, {d, width});
    w.moe = {at(s.router),
             matrix(s.expert_gate, {experts, 2 * h, d}),
             matrix(s.expert_down, {experts, d, h}),
             matrix(s.shared_gate, {2 * hs, d}),
             matrix(s.shared_down, {d, hs}),
             at(s.router_bias)};
    layers_.push_back(w);
  }
  // Multiply-adds per token of the projections, FFNs and LM head (attention over the cache aside).
  const int64_t moe_width =
      c.num_experts_per_tok * c.moe_intermediate_size + c.shared_expert_intermediate_size;
  macs_per_token_ = d * c.vocab_size + d * c.num_experts;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    macs_per_token_ += d * (2 * c.q_size() + 2 * c.kv_size()) +
                       3 * d * (c.layer_is_dense(i) ? c.intermediate_size : moe_width);
  // The cache and RoPE table are sized for every position up front: a count of tokens beyond the
  // machine's memory (generate --max-tokens 1e9) is one line here, not the kernel's OOM kill.
  if (default_device() == Device::kCpu) {
    const double bytes =
        static_cast<double>(max_seq) * sizeof(float) *
        (2.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.kv_size()) +
         static_cast<double>(c.head_size()));
    const double memory = host_memory_limit_bytes();
    MOE_CHECK(memory <= 0.0 || bytes <= memory,
              "[inference] {} positions (prompt and new tokens) need a {:.1f} GiB key/value cache, "
              "more than the {:.1f} GiB of memory this process may use: ask for fewer tokens",
              max_seq, bytes / 1073741824.0, memory / 1073741824.0);
  }
  rope_ = RopeTable::build(max_seq, c.head_size(), c.rope_theta);
  cache_ = KvCache(c.num_hidden_layers, max_seq, c.kv_size());
  device_logits_.resize(static_cast<size_t>(c.vocab_size));
  logits_.assign(static_cast<size_t>(c.vocab_size), 0.0f);
}

InferenceModel::~InferenceModel() = default;

void InferenceModel::reset() {
  cache_.reset();
}

const std::vector<float>& InferenceModel::prefill(const std::vector<int32_t>& prompt) {
  MOE_CHECK(!prompt.empty(), "[inference] prefill needs at least one prompt token");
  return forward(prompt.data(), static_cast<int64_t>(prompt.size()));
}

const std::vector<float>& InferenceModel::decode_step(int32_t token) {
  return forward(&token, 1);
}

void InferenceModel::resize_scratch(int64_t n) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  auto grow = [](auto& v, int64_t count) {
    if (v.size() < static_cast<size_t>(count)) v.resize(static_cast<size_t>(count));
  };
  grow(tokens_, n);
  grow(x_, n * d);
  grow(h_, n * d);
  grow(branch_, n * d);
  grow(rstd_, n);
  grow(q_raw_, n * qs);
  grow(k_raw_, n * kvs);
  grow(q_, n * qs);
  grow(k_, n * kvs);
  grow(v_, n * kvs);
  grow(qk_rstd_, n * std::max(c.num_attention_heads, c.num_key_value_heads));
  grow(context_, n * qs);
  if (c.first_k_dense_replace > 0) {
    grow(mlp_gu_, n * 2 * c.intermediate_size);
    grow(mlp_act_, n * c.intermediate_size);
  }
}

void InferenceModel::set_precision(const PrecisionRecipe& precision) {
  precision_ = precision;
  moe_.set_precision(precision);
}

// q_: [n, nh, hd] at positions [p0, p0 + n); keys/values of positions [0, p0 + n) are in the cache.
// context_[i, h] = softmax_j(q_i,h . k_j,kvh / sqrt(hd)) v_j,kvh over j <= p0 + i, in fp32.
void InferenceModel::attention(int64_t layer, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_size();
  const int64_t keys = cache_.length() + n;
  const KvCache& cache = cache_;
  kernels::cached_attention_forward(view(q_.data(), {n, nh, hd}),
                                    view(cache.k(layer, 0), {keys, nkv, hd}),
                                    view(cache.v(layer, 0), {keys, nkv, hd}), cache_.length(),
                                    view(context_.data(), {n, nh, hd}));
}

const std::vector<float>& InferenceModel::forward(const int32_t* tokens, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, v = c.vocab_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_size();
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Validate everything before touching the cache, so a failed call changes nothing.
  cache_.check_room(n);
  for (int64_t i = 0; i < n; ++i)
    MOE_CHECK(tokens[i] >= 0 && tokens[i] < v,
              "[inference] token id {} at position {} is out of range for vocab_size={}", tokens[i],
              cache_.length() + i, v);
  resize_scratch(n);
  const int64_t p0 = cache_.length();
  const kernels::SerialScope serial(n * macs_per_token_ < kSerialMacs);

  copy_bytes(tokens_.data(), tokens, static_cast<size_t>(n) * sizeof(int32_t));
  kernels::embedding_forward(view(tokens_.data(), {n}), view(embed_, {v, d}),
                             view(x_.data(), {n, d}));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const LayerWeights& w = layers_[static_cast<size_t>(layer)];
    // Attention branch: x += o_proj(attn(rope(qknorm(q)), rope(qknorm(k)), v)) of norm(x)
    // (pre-norm), or x += norm(o_proj(attn(...)) of x) (reordered).
    const bool reordered = c.block_norm == BlockNorm::kReordered;
    const float* attn_in = x_.data();
    if (!reordered) {
      kernels::rmsnorm_forward(view(x_.data(), {n, d}), view(w.input_norm, {d}),
                               view(h_.data(), {n, d}), view(rstd_.data(), {n}), eps);
      attn_in = h_.data();
    }
    if (c.qk_norm == QkNorm::kNone) {
      linear_forward(precision_.attention, attn_in, w.q_proj, q_.data(), n, d, qs);
      linear_forward(precision_.attention, attn_in, w.k_proj, k_.data(), n, d, kvs);
    } else {
      linear_forward(precision_.attention, attn_in, w.q_proj, q_raw_.data(), n, d, qs);
      linear_forward(precision_.attention, attn_in, w.k_proj, k_raw_.data(), n, d, kvs);
      const bool per_head = c.qk_norm == QkNorm::kPerHead;
      kernels::rmsnorm_forward(view(q_raw_.data(), {per_head ? n * nh : n, per_head ? hd : qs}),
                               view(w.q_norm, {per_head ? hd : qs}),
                               view(q_.data(), {per_head ? n * nh : n, per_head ? hd : qs}),
                               view(qk_rstd_.data(), {per_head ? n * nh : n}), eps);
      kernels::rmsnorm_forward(view(k_raw_.data(), {per_head ? n * nkv : n, per_head ? hd : kvs}),
                               view(w.k_norm, {per_head ? hd : kvs}),
                               view(k_.data(), {per_head ? n * nkv : n, per_head ? hd : kvs}),
                               view(qk_rstd_.data(), {per_head ? n * nkv : n}), eps);
    }
    linear_forward(precision_.attention, attn_in, w.v_proj, v_.data(), n, d, kvs);
    kernels::rope_forward(view(q_.data(), {1, n, nh, hd}), rope_.cos_view(), rope_.sin_view(), p0);
    kernels::rope_forward(view(k_.data(), {1, n, nkv, hd}), rope_.cos_view(), rope_.sin_view(), p0);
    // A layer's rows of consecutive positions are consecutive in the cache.
    const size_t row_bytes = static_cast<size_t>(n * kvs) * sizeof(float);
    copy_bytes(cache_.k(layer, p0), k_.data(), row_bytes);
    copy_bytes(cache_.v(layer, p0), v_.data(), row_bytes);
    attention(layer, n);
    linear_forward(precision_.attention, context_.data(), w.o_proj, branch_.data(), n, qs, d);
    if (reordered) {
      kernels::rmsnorm_forward(view(branch_.data(), {n, d}), view(w.input_norm, {d}),
                               view(h_.data(), {n, d}), view(rstd_.data(), {n}), eps);
      add_in_place(x_.data(), h_.data(), n * d);
    } else {
      add_in_place(x_.data(), branch_.data(), n * d);
    }

    // FFN branch: x += ffn(norm(x)) (pre-norm) or x += norm(ffn(x)) (reordered).
    const float* ffn_in = x_.data();
    if (!reordered) {
      kernels::rmsnorm_forward(view(x_.data(), {n, d}), view(w.post_norm, {d}),
                               view(h_.data(), {n, d}), view(rstd_.data(), {n}), eps);
      ffn_in = h_.data();
    }
    if (c.layer_is_dense(layer)) {
      // fp32: nothing is kept for a backward here.
      swiglu_mlp_forward(precision_.dense_mlp, {n, d, c.intermediate_size}, ffn_in, w.mlp_gate_up,
                         w.mlp_down, mlp_gu_.data(),
                         view(mlp_act_.data(), {n, c.intermediate_size}), branch_.data());
    } else {
      moe_.forward(w.moe, ffn_in, n, branch_.data(), moe_cache_, moe_workspace_);
    }
    if (reordered) {
      kernels::rmsnorm_forward(view(branch_.data(), {n, d}), view(w.post_norm, {d}),
                               view(h_.data(), {n, d}), view(rstd_.data(), {n}), eps);
      add_in_place(x_.data(), h_.data(), n * d);
    } else {
      add_in_place(x_.data(), branch_.data(), n * d);
    }
  }
  cache_.advance(n);

  // Only the last position's logits are needed: final norm and LM head on one row.
  const float* last = x_.data() + (n - 1) * d;
  kernels::rmsnorm_forward(view(last, {1, d}), view(final_norm_, {d}), view(h_.data(), {1, d}),
                           view(rstd_.data(), {1}), eps);
  linear_forward(precision_.lm_head, h_.data(), view(lm_head_, {v, d}), device_logits_.data(), 1, d,
                 v);
  copy_bytes(logits_.data(), device_logits_.data(), logits_.size() * sizeof(float));
  return logits_;
}

}  // namespace moecore
