#include "model/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/phase_timer.h"
#include "kernels/ops.h"
#include "model/chunked_lm_head.h"
#include "model/document_mask.h"
#include "model/linear.h"
#include "model/swiglu_mlp.h"

namespace moecore {

// Pre-norm: h1 = norm1(x), mid = x + attn(h1), h2 = norm2(mid), out = mid + ffn(h2).
// Reordered: attn_out = attn(x), mid = x + norm1(attn_out), ffn_out = ffn(mid),
// out = mid + norm2(ffn_out); h1 and h2 stay empty (the sublayers read x and mid).
struct Transformer::LayerCache {
  DeviceArray<float> rstd1, h1;  // attention branch RMSNorm (pre: input; reordered: output)
  AttentionCache attention;
  DeviceArray<float> mid;                // residual after attention
  DeviceArray<float> rstd2, h2;          // FFN branch RMSNorm
  DeviceArray<float> attn_out, ffn_out;  // reordered: the sublayers' outputs, before their norms
  MoeCache moe;
  // The rowwise capacity's drops (outlive a released MoE cache): counted on the host, or, by the
  // padded transport, where the model is (read when asked, after the step).
  int64_t dropped_routes = 0;
  DeviceArray<int64_t> dropped_on_device;  // [1], or empty
  DeviceArray<float> mlp_gu;               // dense layers
  DeviceArray<std::byte> mlp_act;          // in kept_mlp_act_dtype (kDenseLayer)
};

// One micro-batch's activations in this chunk.
struct Transformer::Activations {
  int64_t batch = 0, seq = 0;
  DeviceArray<int32_t> tokens;               // chunk with the embedding
  DeviceArray<int32_t> targets;              // chunk with the head, with targets
  std::vector<int32_t> doc_start_host;       // [B, T] with document masking, else empty...
  DeviceArray<int32_t> doc_start;            // ... and where the attention reads it
  std::vector<DeviceArray<float>> residual;  // [layers + 1][N, d]: input of each layer, then output
  std::vector<LayerCache> layers;            // this chunk's layers
  DeviceArray<float> final_rstd, final_hidden;  // chunk with the head
  // The whole head's logits, from which the backward makes their loss gradient; empty after a
  // forward with the chunked head, which keeps none (head_chunk_tokens > 0,
  // model/chunked_lm_head.h).
  DeviceArray<float> logits;
  int64_t head_chunk_tokens = 0;
  bool logits_on_demand = false;  // a forward without targets that left them to logits_at()
  // [MoE layers][lb_groups][E] load-balancing gradient per router probability, made where the
  // statistics are (kernels::moe_loss_terms) and read by the router's backward.
  DeviceArray<float> lb_score_grad;
  // The groups of tokens the load-balancing terms are per: 1 (the micro-batch), or its instances
  // (lb_loss_granularity "instance").
  int64_t lb_groups = 1;
  // The losses' statistics of a micro-batch, where the model's tensors are: [MoE layers]
  // [lb_groups][E] routes per expert (i64), and f64: per MoE layer lb_groups x E probability
  // sums and the mean logsumexp^2, then with the head the cross-entropy's loss (one per chunk of
  // the head).
  DeviceArray<int64_t> route_counts;
  DeviceArray<double> loss_statistics;
  bool lb_uses_softmax = false;
  int64_t global_tokens = 0;  // tokens of the global micro-batch
  // The cross-entropy's divisor (BatchCounts::divisor, else the counted targets) where the
  // head's kernels read it (f64 [1]): the caller's (BatchCounts::divisor_on_device) or
  // counted_copy, a copy of the host's.
  ConstTensorView divisor;
  DeviceArray<double> counted_copy;
  double router_loss_div = 0;   // what divides the router losses (model.loss_normalizer)
  bool backward_ready = false;  // the last forward kept what the backward needs
};

namespace {

float* at(const ParamBuffers& buffers, const ParamSpec* spec) {
  if (spec == nullptr) return nullptr;
  // Forward passes only read through these views; one binder serves weights and gradients.
  return const_cast<float*>(buffers.at(*spec));
}

// With `wanted`, a chunked head's observer that copies each chunk's rows into `whole` ([tokens,
// vocab] on the host, sized here), for the observer's whole-head tensor; else none.
LmHeadChunkObserver assemble_chunks(bool wanted, std::vector<float>& whole, int64_t tokens,
                                    int64_t vocab) {
  if (!wanted) return {};
  whole.resize(static_cast<size_t>(tokens * vocab));
  return [&whole, vocab](int64_t first_row, ConstTensorView values) {
    copy_bytes(whole.data() + first_row * vocab, values.raw(),
               static_cast<size_t>(values.numel()) * sizeof(float));
  };
}

// A norm's output is named by its module (its weight's name without ".weight"), inside its layer.
std::string_view norm_module(const ParamSpec* spec) {
  std::string_view name = spec->name;
  name.remove_suffix(std::string_view(".weight").size());
  return name.substr(name.find('.', std::string_view("model.layers.").size()) + 1);
}

}  // namespace

void Transformer::set_precision(const PrecisionRecipe& precision) {
  precision_ = precision;
  attention_.set_precision(precision);
  moe_.set_precision(precision);
  bf16_copies_ = Bf16WeightCopies(bf16_copy_ranges(config_, layout_, layers(), precision));
  mx_caches_ = MxWeightCaches(mx_weight_ranges(config_, layout_, layers(), precision),
                              precision.mx.scale_mode);
  copies_source_ = nullptr;
}

void Transformer::refresh_weight_copies(const ParamBuffers& params) {
  if (copy_refresh_ == WeightCopyRefresh::kOnWeightsChanged && copies_source_ == &params) return;
  bf16_copies_.refresh(params);
  mx_caches_.refresh(params);
  copies_source_ = &params;
}

ConstTensorView Transformer::gemm_weight(const ParamBuffers& params, const ParamSpec* spec,
                                         std::initializer_list<int64_t> shape) const {
  if (spec == nullptr) return {};
  const ConstTensorView fp32(params.at(*spec), shape, DType::kF32);
  const uint16_t* copy =
      bf16_copies_.find(spec->group, spec->offset, static_cast<size_t>(fp32.numel()));
  return copy != nullptr ? ConstTensorView(copy, shape, DType::kBf16) : fp32;
}

Transformer::Transformer(const ModelConfig& config, const ParamLayout& layout,
                         const ExpertExchange* exchange, LayerRange layers)
    : config_(config),
      layout_(layout),
      attention_(config_, rope_),
      moe_(config_, {layout.first_local_expert(), layout.local_experts()}, exchange) {
  config_.validate();
  const int64_t total = config_.num_hidden_layers;
  layers_begin_ = layers.begin;
  layers_end_ = layers.end < 0 ? total : layers.end;
  MOE_CHECK(0 <= layers_begin_ && layers_begin_ <= layers_end_ && layers_end_ <= total,
            "[model] layer range [{}, {}) is not inside the model's {} layers", layers_begin_,
            layers_end_, total);
  MOE_CHECK((has_embedding() && has_head()) || config_.lb_loss_style != LbLossStyle::kHf,
            "[parallel] model.lb_loss_style=\"hf\" is one loss over all layers' routers; pipeline "
            "parallelism needs the per-layer \"olmo-core\" style");
  auto find = [&](const std::string& name) {
    const ParamSpec* spec = layout_.find(name);
    MOE_CHECK(spec != nullptr, "[model] the parameter layout has no {}", name);
    return spec;
  };
  if (has_embedding()) embed_ = find("model.embed_tokens.weight");
  if (has_head()) {
    final_norm_ = find("model.norm.weight");
    lm_head_ =
        config_.tie_word_embeddings ? find("model.embed_tokens.weight") : find("lm_head.weight");
  }
  recycled_ = std::make_unique<LayerCache>();
  for (int64_t i = 0; i < total; ++i)
    layer_specs_.push_back(i >= layers_begin_ && i < layers_end_ ? layout_.layer_specs(i)
                                                                 : LayerSpecs{});
  for (int64_t i = layers_begin_; i < layers_end_; ++i)
    if (!config_.layer_is_dense(i)) moe_layers_.push_back(i);
}

Transformer::~Transformer() = default;

AttentionWeights Transformer::attention_weights(const ParamBuffers& params, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  const int64_t d = config_.hidden_size, qs = config_.q_size(), kvs = config_.kv_size();
  return {linear_weight(params, s.q_proj, {qs, d}),
          linear_weight(params, s.k_proj, {kvs, d}),
          linear_weight(params, s.v_proj, {kvs, d}),
          linear_weight(params, s.o_proj, {d, qs}),
          at(params, s.q_norm),
          at(params, s.k_norm)};
}

AttentionGrads Transformer::attention_grads(ParamBuffers& grads, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  return {at(grads, s.q_proj), at(grads, s.k_proj), at(grads, s.v_proj),
          at(grads, s.o_proj), at(grads, s.q_norm), at(grads, s.k_norm)};
}

MoeWeights Transformer::moe_weights(const ParamBuffers& params, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  const int64_t d = config_.hidden_size, h = config_.moe_intermediate_size;
  const int64_t hs = config_.shared_expert_intermediate_size, local = layout_.local_experts();
  return {at(params, s.router),
          gemm_weight(params, s.expert_gate, {local, 2 * h, d}),
          gemm_weight(params, s.expert_down, {local, d, h}),
          linear_weight(params, s.shared_gate, {2 * hs, d}),
          linear_weight(params, s.shared_down, {d, hs}),
          at(params, s.router_bias),
          mx_weight(s.expert_gate),
          mx_weight(s.expert_down)};
}

LinearWeight Transformer::linear_weight(const ParamBuffers& params, const ParamSpec* spec,
                                        std::initializer_list<int64_t> shape) const {
  return {gemm_weight(params, spec, shape), mx_weight(spec)};
}

const MxWeight* Transformer::mx_weight(const ParamSpec* spec) const {
  return spec != nullptr ? mx_caches_.find(spec->group, spec->offset) : nullptr;
}

MoeGrads Transformer::moe_grads(ParamBuffers& grads, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  return {at(grads, s.router), at(grads, s.expert_gate), at(grads, s.expert_down),
          at(grads, s.shared_gate), at(grads, s.shared_down)};
}

const RouterState* Transformer::router_state(int64_t layer) const {
  if (config_.layer_is_dense(layer) || layer < layers_begin_ || layer >= layers_end_ ||
      last_slot_ < 0)
    return nullptr;
  return &slots_[static_cast<size_t>(last_slot_)]
              ->layers[static_cast<size_t>(layer - layers_begin_)]
              .moe.router;
}

void Transformer::emit(const std::string& name, ConstTensorView tensor) const {
  if (tensor.device() == Device::kCpu) {
    observer_(name, tensor);
    return;
  }
  // Observers read on the host: a copy of a device's tensor (observed tensors are contiguous).
  std::vector<std::byte> host(static_cast<size_t>(tensor.numel()) * dtype_size(tensor.dtype()));
  copy_bytes(host.data(), tensor.raw(), host.size());
  observer_(name, tensor.relocated(host.data(), Device::kCpu));
}

void Transformer::observe(const std::string& name, ConstTensorView tensor) const {
  if (observer_ && !recomputing_) emit(name, tensor);
}

void Transformer::observe_layer(int64_t layer, std::string_view module, ConstTensorView tensor,
                                bool gradient) const {
  if (!observer_ || recomputing_) return;
  emit(fmt::format("{}model.layers.{}{}{}", gradient ? "grad." : "", layer,
                   module.empty() ? "" : ".", module),
       tensor);
}

void Transformer::observe_attention(int64_t layer, const AttentionCache& cache,
                                    const float* out) const {
  if (!observer_ || recomputing_) return;
  const AttentionShape& s = cache.shape;
  const int64_t n = s.batch * s.seq;
  if (config_.qk_norm != QkNorm::kNone) {
    observe_layer(layer, "self_attn.q_proj", view(cache.q_raw.data(), {n, s.n_heads * s.head_dim}));
    observe_layer(layer, "self_attn.k_proj",
                  view(cache.k_raw.data(), {n, s.n_kv_heads * s.head_dim}));
  }
  observe_layer(layer, "self_attn.q",
                view(cache.q.data(), {s.batch, s.seq, s.n_heads, s.head_dim}));
  observe_layer(layer, "self_attn.k",
                view(cache.k.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}));
  observe_layer(layer, "self_attn.v",
                view(cache.v.data(), {s.batch, s.seq, s.n_kv_heads, s.head_dim}));
  observe_layer(layer, "self_attn.context",
                view(cache.context.data(), {s.batch, s.seq, s.n_heads, s.head_dim}));
  observe_layer(layer, "self_attn.o_proj", view(out, {n, config_.hidden_size}));
}

void Transformer::observe_ffn(int64_t layer, const LayerCache& cache, int64_t tokens,
                              const float* out) const {
  if (!observer_ || recomputing_) return;
  const int64_t d = config_.hidden_size;
  if (config_.layer_is_dense(layer)) {
    observe_layer(layer, "mlp.gate_up",
                  view(cache.mlp_gu.data(), {tokens, 2 * config_.intermediate_size}));
  } else {
    const RouterState& r = cache.moe.router;
    const int64_t e = config_.num_experts, k = config_.num_experts_per_tok;
    observe_layer(layer, "mlp.gate", view(r.logits.data(), {tokens, e}));
    observe_layer(layer, "mlp.router_scores", view(r.scores.data(), {tokens, e}));
    observe_layer(layer, "mlp.topk_index", view(r.topk_index.data(), {tokens, k}));
    observe_layer(layer, "mlp.topk_weight", view(r.topk_weight.data(), {tokens, k}));
    // The shared expert's gate/up projection, its first GEMM (MXFP8 in the mxfp8 recipe), before
    // the routed experts' outputs, as for a dense layer's MLP.
    if (const int64_t hs = config_.shared_expert_intermediate_size; hs > 0)
      observe_layer(layer, "mlp.shared_expert.gate_up",
                    view(cache.moe.shared_gu.data(), {tokens, 2 * hs}));
    // Each route's output in (token, slot) order, whatever order the dispatch sent it in.
    DeviceArray<float> by_route(cache.moe.routed.y_back.device(),
                                static_cast<size_t>(tokens * k * d));
    kernels::gather_rows(view(cache.moe.routed.y_back.data(),
                              {static_cast<int64_t>(cache.moe.routed.y_back.size()) / d, d}),
                         view(cache.moe.routed.send_pos.data(), {tokens * k}),
                         view(by_route.data(), {tokens * k, d}));
    observe_layer(layer, "mlp.experts", view(by_route.data(), {tokens, k, d}));
  }
  observe_layer(layer, "mlp", view(out, {tokens, d}));
}

int64_t Transformer::dropped_routes(int64_t layer) const {
  if (router_state(layer) == nullptr) return 0;
  const LayerCache& lc =
      slots_[static_cast<size_t>(last_slot_)]->layers[static_cast<size_t>(layer - layers_begin_)];
  return lc.dropped_on_device.empty() ? lc.dropped_routes : host_copy(lc.dropped_on_device)[0];
}

const DeviceArray<float>& Transformer::logits() const {
  MOE_CHECK(last_slot_ >= 0 && has_head(), "[model] logits() needs a forward() of the head first");
  const Activations& act = *slots_[static_cast<size_t>(last_slot_)];
  MOE_CHECK(act.head_chunk_tokens == 0,
            "[model] logits() after a forward with targets and train.lm_head_chunk_tokens={}: the "
            "chunked head keeps no logits (set it to 0, or run the forward without targets)",
            act.head_chunk_tokens);
  MOE_CHECK(!act.logits_on_demand,
            "[model] logits() after a forward with logits on demand: read them with logits_at()");
  return act.logits;
}

void Transformer::logits_at(const ParamBuffers& params, const int32_t* rows, int64_t count,
                            float* out) {
  MOE_CHECK(last_slot_ >= 0 && has_head(),
            "[model] logits_at() needs a forward() of the head first");
  const Activations& act = *slots_[static_cast<size_t>(last_slot_)];
  const int64_t n = act.batch * act.seq, d = config_.hidden_size, v = config_.vocab_size;
  MOE_CHECK(count >= 0, "[model] logits_at() of {} rows", count);
  for (int64_t i = 0; i < count; ++i)
    MOE_CHECK(rows[i] >= 0 && rows[i] < n,
              "[model] logits_at(): row {} is outside the last pass's {} tokens", rows[i], n);
  if (count == 0) return;
  Workspace::Scope scratch(workspace_);
  const std::span<int32_t> row_ids = scratch.uninitialized<int32_t>(count);
  copy_bytes(row_ids.data(), rows, static_cast<size_t>(count) * sizeof(int32_t));
  const std::span<float> hidden = scratch.uninitialized<float>(count * d);
  kernels::gather_rows(view(act.final_hidden.data(), {n, d}), view(row_ids.data(), {count}),
                       view(hidden.data(), {count, d}));
  const std::span<float> logits = scratch.uninitialized<float>(count * v);
  ScopedPhase timer(Phase::kLmHeadForward);
  linear_forward(precision_.lm_head, hidden.data(), gemm_weight(params, lm_head_, {v, d}),
                 logits.data(), count, d, v);
  timer.stop();
  copy_bytes(out, logits.data(), static_cast<size_t>(count * v) * sizeof(float));
}

void Transformer::set_z_loss_multiplier(double multiplier) {
  MOE_CHECK(std::isfinite(multiplier) && multiplier >= 0.0,
            "[model] z_loss_multiplier={} must be finite and >= 0", multiplier);
  z_loss_multiplier_ = multiplier;
}

void Transformer::set_lm_head_chunk_tokens(int64_t tokens) {
  MOE_CHECK(tokens >= 0, "[model] lm_head_chunk_tokens={} must be 0 (the whole head) or positive",
            tokens);
  lm_head_chunk_tokens_ = tokens;
}

LossParts Transformer::forward(const ParamBuffers& params, const int32_t* tokens,
                               const int32_t* targets, int64_t batch, int64_t seq) {
  MOE_CHECK(has_embedding() && has_head(),
            "[model] forward() runs the whole model; use forward_chunk()");
  forward_chunk(0, params, tokens, nullptr, targets, batch, seq, nullptr);
  if (targets == nullptr) return {};
  return read_losses().back();
}

std::vector<LossParts> Transformer::read_losses() {
  const ModelConfig& c = config_;
  if (recorded_counted_.empty()) return {};
  std::vector<double> parts(recorded_losses_.size());
  copy_bytes(parts.data(), recorded_losses_.data(), parts.size() * sizeof(double));
  std::vector<LossParts> losses;
  for (size_t pass = 0; pass < recorded_counted_.size(); ++pass) {
    LossParts loss;
    const double* row = parts.data() + kernels::kLossParts * pass;
    loss.ce = row[kernels::kCeLoss];
    loss.lb = row[kernels::kLbLoss];
    loss.z = row[kernels::kZLoss];
    loss.lm_z = row[kernels::kLmZLoss];
    // In step_decision's order (kernels/step_decision_rules.h): the same bits.
    loss.total = loss.ce + c.router_aux_loss_coef * loss.lb + c.router_z_loss_coef * loss.z +
                 z_loss_multiplier_ * loss.lm_z;
    loss.counted_tokens = recorded_counted_[pass];
    losses.push_back(loss);
  }
  recorded_losses_.resize_for_overwrite(0);
  recorded_counted_.clear();
  return losses;
}

void Transformer::backward(const ParamBuffers& params, ParamBuffers& grads, float loss_scale) {
  backward_chunk(0, params, grads, loss_scale, nullptr, nullptr);
}

void Transformer::attention_sublayer_forward(const ParamBuffers& params, int64_t i, const float* x,
                                             const Activations& act, LayerCache& lc,
                                             float* branch) const {
  const ModelConfig& c = config_;
  const int64_t n = act.batch * act.seq, d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(i)];
  const int32_t* doc_start = act.doc_start.empty() ? nullptr : act.doc_start.data();
  lc.rstd1.resize(static_cast<size_t>(n));
  lc.mid.resize(static_cast<size_t>(n * d));
  if (c.block_norm == BlockNorm::kReordered) {
    // mid = x + norm1(attn(x)); the FFN then reads mid itself.
    lc.attn_out.resize(static_cast<size_t>(n * d));
    attention_.forward(attention_weights(params, i), x, act.batch, act.seq, lc.attn_out.data(),
                       lc.attention, doc_start);
    observe_attention(i, lc.attention, lc.attn_out.data());
    kernels::rmsnorm_forward(view(lc.attn_out.data(), {n, d}), view(at(params, s.input_norm), {d}),
                             view(branch, {n, d}), view(lc.rstd1.data(), {n}), eps);
    observe_layer(i, norm_module(s.input_norm), view(branch, {n, d}));
  } else {
    lc.h1.resize(static_cast<size_t>(n * d));
    kernels::rmsnorm_forward(view(x, {n, d}), view(at(params, s.input_norm), {d}),
                             view(lc.h1.data(), {n, d}), view(lc.rstd1.data(), {n}), eps);
    observe_layer(i, norm_module(s.input_norm), view(lc.h1.data(), {n, d}));
    attention_.forward(attention_weights(params, i), lc.h1.data(), act.batch, act.seq, branch,
                       lc.attention, doc_start);
    observe_attention(i, lc.attention, branch);
  }
  kernels::add(view(x, {n, d}), view(branch, {n, d}), view(lc.mid.data(), {n, d}));
  observe_layer(i, "residual_attn", view(lc.mid.data(), {n, d}));
}

void Transformer::ffn_sublayer_forward(const ParamBuffers& params, int64_t i, int64_t n,
                                       LayerCache& lc, float* branch, float* out) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(i)];
  const bool reordered = c.block_norm == BlockNorm::kReordered;
  lc.rstd2.resize(static_cast<size_t>(n));
  if (!reordered) {
    lc.h2.resize(static_cast<size_t>(n * d));
    kernels::rmsnorm_forward(view(lc.mid.data(), {n, d}), view(at(params, s.post_norm), {d}),
                             view(lc.h2.data(), {n, d}), view(lc.rstd2.data(), {n}), eps);
    observe_layer(i, norm_module(s.post_norm), view(lc.h2.data(), {n, d}));
  }
  const float* ffn_in = reordered ? lc.mid.data() : lc.h2.data();
  float* ffn_out = branch;
  if (reordered) {
    lc.ffn_out.resize(static_cast<size_t>(n * d));
    ffn_out = lc.ffn_out.data();
  }
  if (c.layer_is_dense(i)) {
    const int64_t width = c.intermediate_size;
    const DType act_type = kept_mlp_act_dtype(precision_, SwigluMlp::kDenseLayer);
    lc.mlp_gu.resize(static_cast<size_t>(n * 2 * width));
    lc.mlp_act.resize(static_cast<size_t>(n * width) * dtype_size(act_type));
    swiglu_mlp_forward(precision_.dense_mlp, {n, d, width}, ffn_in,
                       linear_weight(params, s.mlp_gate, {2 * width, d}),
                       linear_weight(params, s.mlp_down, {d, width}), lc.mlp_gu.data(),
                       TensorView(lc.mlp_act.data(), {n, width}, act_type), ffn_out);
  } else {
    // A recomputed forward keeps the selection of the first (same seed and token offset).
    if (!recomputing_)
      lc.moe.router.selection = {c.routing, routing_layer_seed(routing_seed_, i),
                                 routing_token_offset_};
    moe_.forward(moe_weights(params, i), ffn_in, n, ffn_out, lc.moe, workspace_);
    lc.dropped_routes = 0;
    lc.dropped_on_device.resize_for_overwrite(0);
    std::visit(
        [&lc](const auto& cache) {
          if constexpr (requires { cache.dropped_routes; })
            lc.dropped_routes = cache.dropped_routes;
          if constexpr (requires { cache.dropped.data(); }) {
            lc.dropped_on_device.resize_for_overwrite(1);
            copy_bytes(lc.dropped_on_device.data(), cache.dropped.data(), sizeof(int64_t));
          }
        },
        lc.moe.dispatch);
  }
  observe_ffn(i, lc, n, ffn_out);
  if (reordered) {
    kernels::rmsnorm_forward(view(lc.ffn_out.data(), {n, d}), view(at(params, s.post_norm), {d}),
                             view(branch, {n, d}), view(lc.rstd2.data(), {n}), eps);
    observe_layer(i, norm_module(s.post_norm), view(branch, {n, d}));
  }
  if (out == nullptr) return;
  kernels::add(view(lc.mid.data(), {n, d}), view(branch, {n, d}), view(out, {n, d}));
}

namespace {

// Moves a cache member's memory from one holder to the other, leaving `from` empty (a plain
// clear() would keep the capacity where it was).
template <typename T>
void hand_over(T& from, T& to) {
  to = std::move(from);
  from = T();
}

// The members of a layer's cache (Transformer::LayerCache) that `mode` drops after the forward
// and rebuilds in the backward, handed from one cache to the other.
template <typename LayerCache>
void hand_over_recomputed(ActivationRecompute mode, LayerCache& from, LayerCache& to) {
  if (recomputes_attention(mode)) {
    hand_over(from.rstd1, to.rstd1);
    hand_over(from.h1, to.h1);
    hand_over(from.attention, to.attention);
    hand_over(from.attn_out, to.attn_out);
  }
  if (recomputes_ffn(mode)) {
    hand_over(from.rstd2, to.rstd2);
    hand_over(from.h2, to.h2);
    hand_over(from.ffn_out, to.ffn_out);
    hand_over(from.mlp_gu, to.mlp_gu);
    hand_over(from.mlp_act, to.mlp_act);
    // The router state stays (batch statistics, metrics); the rest of the MoE cache goes.
    hand_over(from.moe.routed, to.moe.routed);
    hand_over(from.moe.dispatch, to.moe.dispatch);
    hand_over(from.moe.shared_gu, to.moe.shared_gu);
    hand_over(from.moe.shared_act, to.moe.shared_act);
  }
  // "full" keeps only the block input: the residual after attention is rebuilt too.
  if (mode == ActivationRecompute::kFull) hand_over(from.mid, to.mid);
}

}  // namespace

void Transformer::release_recomputed(LayerCache& lc) {
  hand_over_recomputed(recompute_, lc, *recycled_);
}

void Transformer::reuse_recomputed(LayerCache& lc) {
  hand_over_recomputed(recompute_, *recycled_, lc);
}

void Transformer::forward_chunk(int64_t slot, const ParamBuffers& params, const int32_t* tokens,
                                const float* hidden_in, const int32_t* targets, int64_t batch,
                                int64_t seq, float* hidden_out) {
  ++forward_passes_;
  // This pass's only: a pass that returns early (logits only) or throws leaves none behind.
  const std::optional<BatchCounts> given_counts = std::exchange(next_batch_counts_, std::nullopt);
  refresh_weight_copies(params);
  const ModelConfig& c = config_;
  const int64_t n = batch * seq, d = c.hidden_size, v = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Ids in host memory are checked here; ids in device memory by the kernels, where they are.
  const bool tokens_on_host = tokens == nullptr || device_of(tokens) == Device::kCpu;
  const bool targets_on_host = targets == nullptr || device_of(targets) == Device::kCpu;
  MOE_CHECK(targets_on_host || given_counts,
            "[model] targets in device memory need their counts from the caller "
            "(set_next_batch_counts): a pass does not read them back to count them");
  const int32_t* given_starts = std::exchange(next_document_starts_, nullptr);
  const bool logits_on_demand = std::exchange(next_logits_on_demand_, false) && targets == nullptr;
  MOE_CHECK(tokens_on_host || document_eos_ < 0 || given_starts != nullptr,
            "[model] document masking finds the documents in host memory: give the tokens there, "
            "or the documents' starts (set_next_document_starts)");
  if (has_embedding() && tokens_on_host)
    for (int64_t i = 0; i < n; ++i)
      MOE_CHECK(tokens[i] >= 0 && tokens[i] < v,
                "[data] token id {} at (batch {}, position {}) is out of range for vocab_size={}",
                tokens[i], i / seq, i % seq, v);
  if (targets != nullptr && targets_on_host)
    for (int64_t i = 0; i < n; ++i)
      MOE_CHECK(targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < v),
                "[data] target id {} at (batch {}, position {}) is out of range for vocab_size={} "
                "(use -100 to ignore a position)",
                targets[i], i / seq, i % seq, v);
  MOE_CHECK(slot >= 0, "[model] activation slot {} is negative", slot);
  if (static_cast<size_t>(slot) >= slots_.size()) slots_.resize(static_cast<size_t>(slot + 1));
  if (!slots_[static_cast<size_t>(slot)])
    slots_[static_cast<size_t>(slot)] = std::make_unique<Activations>();
  Activations& act = *slots_[static_cast<size_t>(slot)];
  last_slot_ = slot;
  if (rope_.max_positions < seq) rope_ = RopeTable::build(seq, c.head_size(), c.rope_theta);
  const int64_t count = layers_end_ - layers_begin_;
  act.batch = batch;
  act.seq = seq;
  act.backward_ready = false;
  act.layers.resize(static_cast<size_t>(count));
  act.residual.resize(static_cast<size_t>(count + 1));
  for (auto& r : act.residual) r.resize(static_cast<size_t>(n * d));
  if (has_embedding()) {
    act.tokens.resize(static_cast<size_t>(n));
    copy_bytes(act.tokens.data(), tokens, static_cast<size_t>(n) * sizeof(int32_t));
    kernels::embedding_forward(view(act.tokens.data(), {n}), view(at(params, embed_), {v, d}),
                               view(act.residual[0].data(), {n, d}));
    observe("model.embed_tokens", view(act.residual[0].data(), {n, d}));
  } else {
    copy_bytes(act.residual[0].data(), hidden_in, static_cast<size_t>(n * d) * sizeof(float));
  }
  if (document_eos_ >= 0 && given_starts != nullptr) {
    act.doc_start.resize(static_cast<size_t>(n));  // the pass's own copy, for its backward
    copy_bytes(act.doc_start.data(), given_starts, static_cast<size_t>(n) * sizeof(int32_t));
  } else if (document_eos_ >= 0) {
    MOE_CHECK(tokens != nullptr, "[model] document masking needs the tokens on every chunk");
    act.doc_start_host.resize(static_cast<size_t>(n));
    document_starts(tokens, batch, seq, document_eos_, document_bos_, act.doc_start_host.data());
    act.doc_start.resize(static_cast<size_t>(n));
    copy_bytes(act.doc_start.data(), act.doc_start_host.data(),
               static_cast<size_t>(n) * sizeof(int32_t));
  } else {
    act.doc_start.resize(0);
  }

  Workspace::Scope scratch(workspace_);
  const std::span<float> branch = scratch.zeroed<float>(n * d);
  for (int64_t i = layers_begin_; i < layers_end_; ++i) {
    const size_t j = static_cast<size_t>(i - layers_begin_);
    LayerCache& lc = act.layers[j];
    reuse_recomputed(lc);
    attention_sublayer_forward(params, i, act.residual[j].data(), act, lc, branch.data());
    float* out = act.residual[j + 1].data();
    ffn_sublayer_forward(params, i, n, lc, branch.data(), out);
    observe_layer(i, "", view(out, {n, d}));
    release_recomputed(lc);
  }

  if (has_head()) {
    act.final_rstd.resize(static_cast<size_t>(n));
    act.final_hidden.resize(static_cast<size_t>(n * d));
    kernels::rmsnorm_forward(
        view(act.residual.back().data(), {n, d}), view(at(params, final_norm_), {d}),
        view(act.final_hidden.data(), {n, d}), view(act.final_rstd.data(), {n}), eps);
    observe("model.norm", view(act.final_hidden.data(), {n, d}));
    // A forward without targets is for its logits: the whole head, chunks or not.
    act.head_chunk_tokens = targets != nullptr ? lm_head_chunk_tokens_ : 0;
    act.logits_on_demand = logits_on_demand;
    if (act.head_chunk_tokens > 0 || logits_on_demand) {
      // The chunked head runs with the losses below, logits on demand in logits_at(); the whole
      // head's logits go back.
      act.logits = DeviceArray<float>(act.logits.device());
    } else {
      act.logits.resize(static_cast<size_t>(n * v));
      ScopedPhase timer(Phase::kLmHeadForward);
      linear_forward(precision_.lm_head, act.final_hidden.data(),
                     gemm_weight(params, lm_head_, {v, d}), act.logits.data(), n, d, v);
      timer.stop();
      observe("lm_head", view(act.logits.data(), {n, v}));
    }
  } else {
    copy_bytes(hidden_out, act.residual.back().data(), static_cast<size_t>(n * d) * sizeof(float));
  }

  if (has_head() && targets == nullptr) return;
  MOE_CHECK(
      targets != nullptr || moe_layers_.empty() || c.loss_normalizer != LossNormalizer::kLabels,
      "[model] loss_normalizer = \"labels\" divides the router losses of layers {}-{} by the "
      "counted targets: give their chunk's forward the targets",
      layers_begin_, layers_end_ - 1);

  // Batch statistics, summed over the data-parallel group by batch_sum_ so that every loss and
  // gradient is that of the global batch. First the host's own: counted targets and tokens (given
  // by the caller that holds the global batch, set_next_batch_counts, or counted here and summed;
  // with the head the cross-entropy's gradient divides by the global count). The others stay where
  // the model's tensors are, are summed there and become the losses and the routers' loss gradient
  // there (kernels::moe_loss_terms), so that no pass waits for the device: read_losses() copies the
  // losses to the host, once for all passes.
  const int64_t e_count = c.num_experts;
  const int64_t moe_count = static_cast<int64_t>(moe_layers_.size());
  double batch_counts[2] = {0.0, static_cast<double>(n)};
  if (given_counts) {
    batch_counts[0] = static_cast<double>(given_counts->counted_targets);
    batch_counts[1] = static_cast<double>(given_counts->tokens);
  } else {
    if (targets != nullptr)
      for (int64_t i = 0; i < n; ++i) batch_counts[0] += targets[i] != kIgnoreIndex;
    if (batch_sum_) batch_sum_(batch_counts, 2, DType::kF64);
  }
  const int64_t counted = static_cast<int64_t>(batch_counts[0]);
  const double divisor =
      given_counts && given_counts->divisor > 0.0 ? given_counts->divisor : batch_counts[0];
  if (given_counts && given_counts->divisor_on_device.raw() != nullptr) {
    const ConstTensorView& on_device = given_counts->divisor_on_device;
    MOE_CHECK(on_device.numel() == 1 && on_device.dtype() == DType::kF64 &&
                  on_device.device() == act.loss_statistics.device(),
              "[model] the counted targets in device memory are one f64 where the model's tensors "
              "are ({}), got {} {} in {} memory",
              device_name(act.loss_statistics.device()), on_device.numel(),
              dtype_name(on_device.dtype()), device_name(on_device.device()));
    MOE_CHECK(c.loss_normalizer != LossNormalizer::kLabels || moe_layers_.empty(),
              "[model] loss_normalizer = \"labels\" divides the router losses by the counted "
              "targets on the host: give them there, not in device memory");
    act.divisor = on_device;
  } else {
    act.counted_copy.resize_for_overwrite(1);
    copy_bytes(act.counted_copy.data(), &divisor, sizeof(double));
    act.divisor = view(act.counted_copy.data(), {1});
  }
  act.global_tokens = static_cast<int64_t>(batch_counts[1]);
  act.router_loss_div = c.loss_normalizer == LossNormalizer::kLabels
                            ? divisor
                            : static_cast<double>(act.global_tokens);
  act.lb_uses_softmax = c.lb_loss_style == LbLossStyle::kHf;

  // Per MoE layer: its routes per expert, its probability sums (per instance under instance
  // granularity) and mean logsumexp^2; with the head, the cross-entropy's losses (one pair per
  // chunk with the chunked head, added in chunk order).
  act.lb_groups =
      c.lb_loss_granularity == LbLossGranularity::kInstance ? std::max<int64_t>(act.batch, 1) : 1;
  const int64_t group_row = act.lb_groups * e_count;
  const int64_t per_layer = group_row + 1;
  const int64_t head_chunks = !has_head() ? 0
                              : act.head_chunk_tokens == 0
                                  ? 1
                                  : LmHeadChunks{n, d, v, act.head_chunk_tokens}.count();
  const int64_t head_losses = head_chunks * kernels::kHeadLosses;
  act.route_counts.resize_for_overwrite(static_cast<size_t>(moe_count * group_row));
  act.loss_statistics.resize_for_overwrite(
      static_cast<size_t>(moe_count * per_layer + head_losses));
  for (int64_t j = 0; j < moe_count; ++j) {
    const MoeCache& mc =
        act.layers[static_cast<size_t>(moe_layers_[static_cast<size_t>(j)] - layers_begin_)].moe;
    int64_t* layer_counts = act.route_counts.data() + j * group_row;
    if (act.lb_groups == 1)
      copy_bytes(layer_counts, mc.router.expert_counts.data(),
                 static_cast<size_t>(e_count) * sizeof(int64_t));
    else
      router_group_counts(mc.router_shape, mc.router, view(layer_counts, {act.lb_groups, e_count}));
    double* layer_sums = act.loss_statistics.data() + j * per_layer;
    const TensorView group_sums = view(layer_sums, {act.lb_groups, e_count});
    if (act.lb_uses_softmax)
      router_softmax_column_sums(mc.router_shape, mc.router, group_sums);
    else
      router_lb_column_sums(mc.router_shape, mc.router, group_sums);
    router_z_loss(mc.router_shape, mc.router, view(layer_sums + group_row, {1}));
  }
  double* head_loss = act.loss_statistics.data() + moe_count * per_layer;
  if (has_head()) {
    act.targets.resize(static_cast<size_t>(n));
    copy_bytes(act.targets.data(), targets, static_cast<size_t>(n) * sizeof(int32_t));
    ScopedPhase timer(Phase::kLmHeadForward);
    if (act.head_chunk_tokens > 0) {
      // An observer (a tensor dump) sees the whole head's logits, assembled on the host.
      std::vector<float> observed;
      const LmHeadChunkObserver collect =
          assemble_chunks(observer_ && !recomputing_, observed, n, v);
      chunked_lm_head_forward(
          precision_.lm_head, act.final_hidden.data(), gemm_weight(params, lm_head_, {v, d}),
          act.targets.data(), LmHeadChunks{n, d, v, act.head_chunk_tokens}, act.divisor,
          view(head_loss, {head_chunks, kernels::kHeadLosses}), workspace_, collect);
      if (collect) observe("lm_head", view(observed.data(), {n, v}));
    } else {
      // The loss only: an evaluation never needs the gradient, and the backward makes it from
      // the kept logits (the same rows through the same steps, so the same values).
      kernels::cross_entropy(view(act.logits.data(), {n, v}), view(act.targets.data(), {n}),
                             TensorView(), 1.0f, 0.0f, act.divisor,
                             view(head_loss, {kernels::kHeadLosses}));
    }
  }
  // lb_loss_scope "rank" (and instance granularity): every term is made of this rank's
  // statistics alone, the losses summed over the group once made. Each is linear in them (the
  // cross-entropy's and z-losses' sums, the rank's routes times its own scores, an instance's
  // routes times its own), so the sum is the global micro-batch's loss; only "global"'s
  // load-balancing term multiplies two sums over the group.
  const bool per_rank = c.lb_terms_per_rank() && batch_sum_;
  if (batch_sum_ && !per_rank) {
    if (!act.route_counts.empty())
      batch_sum_(act.route_counts.data(), static_cast<int64_t>(act.route_counts.size()),
                 DType::kI64);
    if (!act.loss_statistics.empty())
      batch_sum_(act.loss_statistics.data(), static_cast<int64_t>(act.loss_statistics.size()),
                 DType::kF64);
  }

  // The pass's losses, one more row of recorded_losses_, and the routers' loss gradient: with
  // the routes held constant (no gradient through them, as the references), lb's gradient is a
  // constant per (layer, group, expert) for the probability of every token of the group (one
  // group, or the instances).
  const Device device = act.loss_statistics.device();
  if (recorded_counted_.empty()) recorded_losses_.place_on(device);
  const size_t row = recorded_counted_.size();
  recorded_losses_.resize_for_overwrite(kernels::kLossParts * (row + 1));
  recorded_counted_.push_back(has_head() ? counted : 0);
  act.lb_score_grad.resize_for_overwrite(static_cast<size_t>(moe_count * group_row));
  TensorView tally;
  if (c.has_router_bias() && moe_count > 0) {
    // Routes per expert of the global micro-batch (per rank: the rank's, summed over the group
    // by update_router_bias), for the selection-bias update (trainer).
    selection_tally_.place_on(device);
    selection_tally_.resize(static_cast<size_t>(moe_count * e_count));
    tally = view(selection_tally_.data(), {moe_count, e_count});
  }
  // Per rank the mean scores are over the rank's tokens (OLMo-core's local_batch granularity), per
  // instance over the instance's; the divisor of the routes stays the global micro-batch's (its
  // loss_div_factor).
  const MoeLossOptions options{.lb_over_all_layers = act.lb_uses_softmax,
                               .top_k = c.num_experts_per_tok,
                               .router_loss_div = act.router_loss_div,
                               .tokens = static_cast<double>(per_rank ? n : act.global_tokens),
                               .z_rows = static_cast<double>(n),
                               .aux_loss_coef = c.router_aux_loss_coef,
                               .lb_groups = act.lb_groups};
  double* losses = recorded_losses_.data() + kernels::kLossParts * row;
  kernels::moe_loss_terms(view(act.route_counts.data(), {moe_count, group_row}),
                          view(act.loss_statistics.data(), {moe_count, per_layer}),
                          view(head_loss, {head_chunks, kernels::kHeadLosses}), options,
                          view(losses, {kernels::kLossParts}),
                          view(act.lb_score_grad.data(), {moe_count, group_row}), tally);
  if (per_rank) batch_sum_(losses, kernels::kLossParts, DType::kF64);
  act.backward_ready = true;
}

void Transformer::backward_chunk(int64_t slot, const ParamBuffers& params, ParamBuffers& grads,
                                 float loss_scale, const float* d_hidden_out, float* d_hidden_in) {
  const ModelConfig& c = config_;
  MOE_CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size() &&
                slots_[static_cast<size_t>(slot)] &&
                slots_[static_cast<size_t>(slot)]->backward_ready,
            "[model] backward() needs a forward() with targets first");
  Activations& act = *slots_[static_cast<size_t>(slot)];
  const int64_t n = act.batch * act.seq, d = c.hidden_size, v = c.vocab_size;

  Workspace::Scope scratch(workspace_);
  const std::span<float> dx = scratch.zeroed<float>(n * d);  // gradient of the residual stream
  if (has_head()) {
    // The head's temporaries go back before the layers take theirs (the logits' can be the
    // largest of the pass).
    Workspace::Scope head_scratch(workspace_);
    ScopedPhase timer(Phase::kLmHeadBackward);
    const std::span<float> dhidden = head_scratch.zeroed<float>(n * d);
    if (act.head_chunk_tokens > 0) {
      const LmHeadChunks head_chunks{n, d, v, act.head_chunk_tokens};
      std::vector<float> observed;
      const LmHeadChunkObserver collect =
          assemble_chunks(observer_ && !recomputing_, observed, n, v);
      chunked_lm_head_backward(
          precision_.lm_head, act.final_hidden.data(), gemm_weight(params, lm_head_, {v, d}),
          act.targets.data(), head_chunks, act.divisor, static_cast<float>(z_loss_multiplier_),
          loss_scale, dhidden.data(), at(grads, lm_head_), workspace_, collect);
      if (collect) observe("grad.lm_head", view(observed.data(), {n, v}));
    } else {
      // From the kept logits, every row at once.
      const std::span<float> dlogits = head_scratch.uninitialized<float>(n * v);
      lm_head_backward_from_logits(precision_.lm_head, act.logits.data(), act.final_hidden.data(),
                                   gemm_weight(params, lm_head_, {v, d}), act.targets.data(), n, d,
                                   v, act.divisor, static_cast<float>(z_loss_multiplier_),
                                   loss_scale, dlogits.data(), dhidden.data(), at(grads, lm_head_),
                                   workspace_);
      observe("grad.lm_head", view(dlogits.data(), {n, v}));
    }
    timer.stop();
    observe("grad.model.norm", view(dhidden.data(), {n, d}));
    kernels::rmsnorm_backward(view(dhidden.data(), {n, d}),
                              view(act.residual.back().data(), {n, d}),
                              view(at(params, final_norm_), {d}), view(act.final_rstd.data(), {n}),
                              view(dx.data(), {n, d}), view(at(grads, final_norm_), {d}), false);
  } else {
    copy_bytes(dx.data(), d_hidden_out, static_cast<size_t>(n * d) * sizeof(float));
  }

  const std::span<float> dbranch = scratch.zeroed<float>(n * d);
  // The dense MLPs' scratch and the reordered norms' input gradient, for every layer in turn.
  bool dense_layers = false;
  for (int64_t i = layers_begin_; i < layers_end_; ++i) dense_layers |= c.layer_is_dense(i);
  const int64_t width = dense_layers ? c.intermediate_size : 0;
  const DType act_type = kept_mlp_act_dtype(precision_, SwigluMlp::kDenseLayer);
  const std::span<float> scratch_dact = scratch.zeroed<float>(n * width);
  // Written in full by the SwiGLU's backward.
  const std::span<std::byte> scratch_dgu =
      scratch.uninitialized<std::byte>(n * 2 * width * static_cast<int64_t>(dtype_size(act_type)));
  const std::span<float> dnorm =
      scratch.zeroed<float>(c.block_norm == BlockNorm::kReordered ? n * d : 0);
  const float z_grad_scale = act.global_tokens > 0 && act.router_loss_div > 0.0
                                 ? static_cast<float>(c.router_z_loss_coef) * loss_scale /
                                       static_cast<float>(act.router_loss_div)
                                 : 0.0f;
  const int64_t lb_values = act.lb_groups * c.num_experts;  // one layer's lb_score_grad
  const std::span<float> lb_grad = scratch.zeroed<float>(lb_values);
  int64_t moe_index = static_cast<int64_t>(moe_layers_.size());  // of layer i, counted down
  for (int64_t i = layers_end_ - 1; i >= layers_begin_; --i) {
    const size_t j = static_cast<size_t>(i - layers_begin_);
    const LayerSpecs& s = layer_specs_[static_cast<size_t>(i)];
    LayerCache& lc = act.layers[j];
    const bool reordered = c.block_norm == BlockNorm::kReordered;
    if (recompute_ != ActivationRecompute::kNone) {
      // Rebuild what the forward dropped from what it kept (dbranch is free scratch here).
      reuse_recomputed(lc);
      recomputing_ = true;
      if (recomputes_attention(recompute_))
        attention_sublayer_forward(params, i, act.residual[j].data(), act, lc, dbranch.data());
      if (recomputes_ffn(recompute_))
        ffn_sublayer_forward(params, i, n, lc, dbranch.data(), nullptr);
      recomputing_ = false;
    }
    observe_layer(i, "", view(dx.data(), {n, d}), true);
    // FFN branch. Pre: out = mid + ffn(norm2(mid)); reordered: out = mid + norm2(ffn(mid)).
    // dx holds d out; d_ffn_out is the gradient reaching the FFN's output.
    const float* d_ffn_out = dx.data();
    if (reordered) {
      observe_layer(i, norm_module(s.post_norm), view(dx.data(), {n, d}), true);
      kernels::rmsnorm_backward(view(dx.data(), {n, d}), view(lc.ffn_out.data(), {n, d}),
                                view(at(params, s.post_norm), {d}), view(lc.rstd2.data(), {n}),
                                view(dnorm.data(), {n, d}), view(at(grads, s.post_norm), {d}),
                                false);
      d_ffn_out = dnorm.data();
    }
    observe_layer(i, "mlp", view(d_ffn_out, {n, d}), true);
    const float* ffn_in = reordered ? lc.mid.data() : lc.h2.data();
    if (c.layer_is_dense(i)) {
      swiglu_mlp_backward(precision_.dense_mlp, {n, d, width}, d_ffn_out, ffn_in,
                          linear_weight(params, s.mlp_gate, {2 * width, d}),
                          linear_weight(params, s.mlp_down, {d, width}), lc.mlp_gu.data(),
                          ConstTensorView(lc.mlp_act.data(), {n, width}, act_type), dbranch.data(),
                          at(grads, s.mlp_gate), at(grads, s.mlp_down), scratch_dact.data(),
                          TensorView(scratch_dgu.data(), {n, 2 * width}, act_type), false);
    } else {
      --moe_index;
      kernels::scale(view(act.lb_score_grad.data() + moe_index * lb_values, {lb_values}),
                     loss_scale, view(lb_grad.data(), {lb_values}));
      moe_.backward(moe_weights(params, i), moe_grads(grads, i), ffn_in, d_ffn_out, lc.moe,
                    {lb_grad.data(), act.lb_uses_softmax, z_grad_scale, act.lb_groups},
                    dbranch.data(), workspace_);
    }
    if (reordered) {
      // d mid = d out + the FFN's input gradient; then mid = x + norm1(attn(x)).
      kernels::add(view(dx.data(), {n, d}), view(dbranch.data(), {n, d}), view(dx.data(), {n, d}));
      observe_layer(i, "residual_attn", view(dx.data(), {n, d}), true);
      observe_layer(i, norm_module(s.input_norm), view(dx.data(), {n, d}), true);
      kernels::rmsnorm_backward(view(dx.data(), {n, d}), view(lc.attn_out.data(), {n, d}),
                                view(at(params, s.input_norm), {d}), view(lc.rstd1.data(), {n}),
                                view(dnorm.data(), {n, d}), view(at(grads, s.input_norm), {d}),
                                false);
      observe_layer(i, "self_attn.o_proj", view(dnorm.data(), {n, d}), true);
      attention_.backward(attention_weights(params, i), attention_grads(grads, i),
                          act.residual[j].data(), dnorm.data(), lc.attention, dbranch.data(),
                          workspace_);
      kernels::add(view(dx.data(), {n, d}), view(dbranch.data(), {n, d}), view(dx.data(), {n, d}));
    } else {
      observe_layer(i, norm_module(s.post_norm), view(dbranch.data(), {n, d}), true);
      kernels::rmsnorm_backward(view(dbranch.data(), {n, d}), view(lc.mid.data(), {n, d}),
                                view(at(params, s.post_norm), {d}), view(lc.rstd2.data(), {n}),
                                view(dx.data(), {n, d}), view(at(grads, s.post_norm), {d}), true);
      observe_layer(i, "residual_attn", view(dx.data(), {n, d}), true);
      observe_layer(i, "self_attn.o_proj", view(dx.data(), {n, d}), true);
      // Attention branch: mid = x + attn(norm(x)).
      attention_.backward(attention_weights(params, i), attention_grads(grads, i), lc.h1.data(),
                          dx.data(), lc.attention, dbranch.data(), workspace_);
      observe_layer(i, norm_module(s.input_norm), view(dbranch.data(), {n, d}), true);
      kernels::rmsnorm_backward(view(dbranch.data(), {n, d}), view(act.residual[j].data(), {n, d}),
                                view(at(params, s.input_norm), {d}), view(lc.rstd1.data(), {n}),
                                view(dx.data(), {n, d}), view(at(grads, s.input_norm), {d}), true);
    }
    release_recomputed(lc);
    if (layer_grads_ready_) layer_grads_ready_(i);
  }
  if (has_embedding()) {
    observe("grad.model.embed_tokens", view(dx.data(), {n, d}));
    kernels::embedding_backward(view(act.tokens.data(), {n}), view(dx.data(), {n, d}),
                                view(at(grads, embed_), {config_.vocab_size, d}),
                                config_.pad_token_id);
  } else {
    observe_layer(layers_begin_ - 1, "", view(dx.data(), {n, d}), true);
    copy_bytes(d_hidden_in, dx.data(), static_cast<size_t>(n * d) * sizeof(float));
  }
}

}  // namespace moecore

namespace moecore {

void Transformer::clear_selection_counts() {
  selection_tally_.zero();
}

void Transformer::note_replayed_passes(std::span<const int64_t> counted_targets) {
  const size_t rows = kernels::kLossParts * counted_targets.size();
  // The captured passes wrote their rows at this buffer's address: it must not move.
  MOE_CHECK(rows <= recorded_losses_.capacity(),
            "[model] {} replayed passes, but the capture recorded the losses of fewer",
            counted_targets.size());
  recorded_losses_.resize_for_overwrite(rows);
  recorded_counted_.clear();
  for (const int64_t counted : counted_targets)
    recorded_counted_.push_back(has_head() ? counted : 0);
}

ConstTensorView Transformer::recorded_losses() const {
  return view(recorded_losses_.data(),
              {static_cast<int64_t>(recorded_counted_.size()), kernels::kLossParts});
}

void Transformer::update_router_bias(ParamBuffers& params, ConstTensorView step_factors) {
  const ModelConfig& c = config_;
  if (!c.has_router_bias() || selection_tally_.empty()) return;  // no forward since the clear
  const int64_t e_count = c.num_experts;
  // Per rank, the passes tallied this rank's routes; the update reads the group's (OLMo-core
  // sums its routes over the data-parallel group for it either way). Whole numbers: exact.
  if (c.lb_terms_per_rank() && batch_sum_)
    batch_sum_(selection_tally_.data(), static_cast<int64_t>(selection_tally_.size()), DType::kF64);
  for (size_t j = 0; j < moe_layers_.size(); ++j) {
    // OLMo-core: bias += gamma * sign(mean - count), no re-centring; where the bias is, from
    // the tally where it is.
    kernels::router_bias_update(
        view(selection_tally_.data() + static_cast<int64_t>(j) * e_count, {e_count}),
        static_cast<float>(c.router_bias_update_rate), step_factors,
        view(at(params, layer_specs_[static_cast<size_t>(moe_layers_[j])].router_bias), {e_count}));
  }
  clear_selection_counts();
}

}  // namespace moecore
