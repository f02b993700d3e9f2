#include "model/transformer.h"

#include <algorithm>

#include "core/check.h"
#include "core/phase_timer.h"
#include "model/cross_entropy.h"
#include "model/embedding.h"
#include "model/linear.h"
#include "model/rmsnorm.h"
#include "model/swiglu_mlp.h"

namespace moecore {

struct Transformer::LayerCache {
  std::vector<float> rstd1, h1;  // input RMSNorm
  AttentionCache attention;
  std::vector<float> mid;        // residual after attention
  std::vector<float> rstd2, h2;  // post-attention RMSNorm
  MoeCache moe;
  std::vector<float> mlp_gu, mlp_act;  // dense layers
};

namespace {

float* at(const ParamBuffers& buffers, const ParamSpec* spec) {
  if (spec == nullptr) return nullptr;
  // Forward passes only read through these views; one binder serves weights and gradients.
  return const_cast<float*>(buffers.at(*spec));
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, const ParamLayout& layout,
                         const ExpertExchange* exchange)
    : config_(config),
      layout_(layout),
      attention_(config_, rope_),
      moe_(config_, {layout.first_local_expert(), layout.local_experts()}, exchange) {
  config_.validate();
  auto find = [&](const std::string& name) { return layout_.find(name); };
  embed_ = find("model.embed_tokens.weight");
  final_norm_ = find("model.norm.weight");
  lm_head_ = config_.tie_word_embeddings ? embed_ : find("lm_head.weight");
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    layer_specs_.push_back(layout_.layer_specs(i));
  layers_.resize(static_cast<size_t>(config_.num_hidden_layers));
}

Transformer::~Transformer() = default;

AttentionWeights Transformer::attention_weights(const ParamBuffers& b, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  return {at(b, s.q_proj), at(b, s.k_proj), at(b, s.v_proj),
          at(b, s.o_proj), at(b, s.q_norm), at(b, s.k_norm)};
}

MoeWeights Transformer::moe_weights(const ParamBuffers& b, int64_t layer) const {
  const LayerSpecs& s = layer_specs_[static_cast<size_t>(layer)];
  return {at(b, s.router), at(b, s.expert_gate), at(b, s.expert_down), at(b, s.shared_gate),
          at(b, s.shared_down)};
}

const RouterState* Transformer::router_state(int64_t layer) const {
  if (config_.layer_is_dense(layer)) return nullptr;
  return &layers_[static_cast<size_t>(layer)].moe.router;
}

LossParts Transformer::forward(const ParamBuffers& params, const int32_t* tokens,
                               const int32_t* targets, int64_t batch, int64_t seq) {
  const ModelConfig& c = config_;
  const int64_t n = batch * seq, d = c.hidden_size, v = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t i = 0; i < n; ++i) {
    MOE_CHECK(tokens[i] >= 0 && tokens[i] < v,
              "[data] token id {} at (batch {}, position {}) is out of range for vocab_size={}",
              tokens[i], i / seq, i % seq, v);
    if (targets != nullptr)
      MOE_CHECK(targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < v),
                "[data] target id {} at (batch {}, position {}) is out of range for vocab_size={} "
                "(use -100 to ignore a position)",
                targets[i], i / seq, i % seq, v);
  }
  if (rope_.max_positions < seq) rope_ = RopeTable::build(seq, c.head_size(), c.rope_theta);
  batch_ = batch;
  seq_ = seq;
  tokens_.assign(tokens, tokens + n);

  residual_.resize(static_cast<size_t>(c.num_hidden_layers + 1));
  for (auto& r : residual_) r.resize(static_cast<size_t>(n * d));
  embedding_forward(tokens, at(params, embed_), residual_[0].data(), n, d);

  std::vector<float> branch(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerSpecs& s = layer_specs_[static_cast<size_t>(i)];
    LayerCache& lc = layers_[static_cast<size_t>(i)];
    const float* x = residual_[static_cast<size_t>(i)].data();
    lc.rstd1.resize(static_cast<size_t>(n));
    lc.h1.resize(static_cast<size_t>(n * d));
    rmsnorm_forward(x, at(params, s.input_norm), lc.h1.data(), lc.rstd1.data(), n, d, eps);
    attention_.forward(attention_weights(params, i), lc.h1.data(), batch, seq, branch.data(),
                       lc.attention);
    lc.mid.resize(static_cast<size_t>(n * d));
    for (int64_t j = 0; j < n * d; ++j)
      lc.mid[static_cast<size_t>(j)] = x[j] + branch[static_cast<size_t>(j)];

    lc.rstd2.resize(static_cast<size_t>(n));
    lc.h2.resize(static_cast<size_t>(n * d));
    rmsnorm_forward(lc.mid.data(), at(params, s.post_norm), lc.h2.data(), lc.rstd2.data(), n, d,
                    eps);
    if (c.layer_is_dense(i)) {
      const int64_t width = c.intermediate_size;
      lc.mlp_gu.resize(static_cast<size_t>(n * 2 * width));
      lc.mlp_act.resize(static_cast<size_t>(n * width));
      swiglu_mlp_forward({n, d, width}, lc.h2.data(), at(params, s.mlp_gate),
                         at(params, s.mlp_down), lc.mlp_gu.data(), lc.mlp_act.data(),
                         branch.data());
    } else {
      lc.moe.router.selection = {c.routing, routing_layer_seed(routing_seed_, i),
                                 routing_token_offset_};
      moe_.forward(moe_weights(params, i), lc.h2.data(), n, branch.data(), lc.moe);
    }
    float* out = residual_[static_cast<size_t>(i + 1)].data();
    for (int64_t j = 0; j < n * d; ++j)
      out[j] = lc.mid[static_cast<size_t>(j)] + branch[static_cast<size_t>(j)];
  }

  final_rstd_.resize(static_cast<size_t>(n));
  final_hidden_.resize(static_cast<size_t>(n * d));
  rmsnorm_forward(residual_.back().data(), at(params, final_norm_), final_hidden_.data(),
                  final_rstd_.data(), n, d, eps);
  logits_.resize(static_cast<size_t>(n * v));
  ScopedPhase timer(Phase::kLmHeadForward);
  linear_forward(final_hidden_.data(), at(params, lm_head_), logits_.data(), n, d, v);
  timer.stop();

  LossParts loss;
  if (targets == nullptr) return loss;

  // Batch statistics, summed over the data-parallel group by batch_sum_ so that every loss and
  // gradient is that of the global batch: [counted targets, tokens, then per MoE layer: routes per
  // expert (E), load-balancing probability sums (E), sum of logsumexp^2].
  const int64_t e_count = c.num_experts, k = c.num_experts_per_tok;
  const int64_t moe_layers = c.num_hidden_layers - c.first_k_dense_replace;
  const int64_t per_layer = 2 * e_count + 1;
  std::vector<double> stats(static_cast<size_t>(2 + moe_layers * per_layer), 0.0);
  for (int64_t i = 0; i < n; ++i) stats[0] += targets[i] != kIgnoreIndex;
  stats[1] = static_cast<double>(n);
  lb_uses_softmax_ = c.lb_loss_style == LbLossStyle::kHf;
  for (int64_t j = 0; j < moe_layers; ++j) {
    const MoeCache& mc = layers_[static_cast<size_t>(c.first_k_dense_replace + j)].moe;
    double* layer_stats = stats.data() + 2 + j * per_layer;
    const std::vector<double> sums = lb_uses_softmax_
                                         ? router_softmax_column_sums(mc.router_shape, mc.router)
                                         : router_score_column_sums(mc.router_shape, mc.router);
    for (int64_t e = 0; e < e_count; ++e) {
      layer_stats[e] = static_cast<double>(mc.router.expert_counts[static_cast<size_t>(e)]);
      layer_stats[e_count + e] = sums[static_cast<size_t>(e)];
    }
    layer_stats[2 * e_count] = router_z_loss(mc.router_shape, mc.router) * static_cast<double>(n);
  }
  if (batch_sum_) batch_sum_(stats.data(), static_cast<int64_t>(stats.size()));
  const int64_t counted = static_cast<int64_t>(stats[0]);
  global_tokens_ = static_cast<int64_t>(stats[1]);

  dlogits_.resize(logits_.size());
  timer.switch_to(Phase::kLmHeadForward);
  const CrossEntropyResult ce =
      cross_entropy(logits_.data(), targets, n, v, dlogits_.data(), 1.0f, counted);
  timer.stop();
  double ce_sum = ce.loss * static_cast<double>(counted);
  if (batch_sum_) batch_sum_(&ce_sum, 1);
  loss.ce = counted > 0 ? ce_sum / static_cast<double>(counted) : 0.0;
  loss.counted_tokens = counted;

  // Router losses. The per-token load-balancing gradient is a constant per (layer, expert):
  // lb_score_grad_[layer][e] = d lb / d p[t, e], with f_e held constant (no gradient, as the
  // references do).
  lb_score_grad_.assign(static_cast<size_t>(c.num_hidden_layers * e_count), 0.0f);
  if (moe_layers > 0 && global_tokens_ > 0) {
    const double nd = static_cast<double>(global_tokens_);
    std::vector<double> hf_counts(static_cast<size_t>(e_count), 0.0);
    std::vector<double> hf_prob_sums(static_cast<size_t>(e_count), 0.0);
    for (int64_t j = 0; j < moe_layers; ++j) {
      const int64_t i = c.first_k_dense_replace + j;
      const double* layer_stats = stats.data() + 2 + j * per_layer;
      loss.z += layer_stats[2 * e_count] / nd;
      if (c.lb_loss_style == LbLossStyle::kOlmoCore) {
        const double scale = static_cast<double>(e_count) / static_cast<double>(k);
        for (int64_t e = 0; e < e_count; ++e) {
          const double f = layer_stats[e] / nd;
          loss.lb += scale * f * layer_stats[e_count + e] / nd;
          lb_score_grad_[static_cast<size_t>(i * e_count + e)] =
              static_cast<float>(c.router_aux_loss_coef * scale * f / nd);
        }
      } else {
        for (int64_t e = 0; e < e_count; ++e) {
          hf_counts[static_cast<size_t>(e)] += layer_stats[e];
          hf_prob_sums[static_cast<size_t>(e)] += layer_stats[e_count + e];
        }
      }
    }
    if (c.lb_loss_style == LbLossStyle::kHf) {
      // transformers' load_balancing_loss_func over all layers' logits concatenated (R rows).
      const double rows = nd * static_cast<double>(moe_layers);
      for (int64_t e = 0; e < e_count; ++e) {
        const double f = hf_counts[static_cast<size_t>(e)] / rows;
        loss.lb += static_cast<double>(e_count) * f * hf_prob_sums[static_cast<size_t>(e)] / rows;
        const float g =
            static_cast<float>(c.router_aux_loss_coef * static_cast<double>(e_count) * f / rows);
        for (int64_t i = c.first_k_dense_replace; i < c.num_hidden_layers; ++i)
          lb_score_grad_[static_cast<size_t>(i * e_count + e)] = g;
      }
    }
  }
  loss.total = loss.ce + c.router_aux_loss_coef * loss.lb + c.router_z_loss_coef * loss.z;
  return loss;
}

void Transformer::backward(const ParamBuffers& params, ParamBuffers& grads, float loss_scale) {
  const ModelConfig& c = config_;
  MOE_CHECK(!dlogits_.empty(), "[model] backward() needs a forward() with targets first");
  const int64_t n = batch_ * seq_, d = c.hidden_size, v = c.vocab_size;
  ScopedPhase timer(Phase::kLmHeadBackward);
  std::vector<float> dlogits(dlogits_.size());
  for (size_t j = 0; j < dlogits.size(); ++j) dlogits[j] = dlogits_[j] * loss_scale;

  std::vector<float> dhidden(static_cast<size_t>(n * d));
  linear_backward(dlogits.data(), final_hidden_.data(), at(params, lm_head_), dhidden.data(),
                  at(grads, lm_head_), n, d, v, false);
  timer.stop();
  std::vector<float> dx(static_cast<size_t>(n * d));  // gradient of the residual stream
  rmsnorm_backward(dhidden.data(), residual_.back().data(), at(params, final_norm_),
                   final_rstd_.data(), dx.data(), at(grads, final_norm_), n, d, false);

  std::vector<float> dbranch(static_cast<size_t>(n * d));
  std::vector<float> scratch_dact, scratch_dgu;
  const float z_grad_scale = global_tokens_ > 0
                                 ? static_cast<float>(c.router_z_loss_coef) * loss_scale /
                                       static_cast<float>(global_tokens_)
                                 : 0.0f;
  std::vector<float> lb_grad(static_cast<size_t>(c.num_experts));
  for (int64_t i = c.num_hidden_layers - 1; i >= 0; --i) {
    const LayerSpecs& s = layer_specs_[static_cast<size_t>(i)];
    const LayerCache& lc = layers_[static_cast<size_t>(i)];
    // FFN branch: out = mid + ffn(norm(mid)); dx currently holds d out.
    if (c.layer_is_dense(i)) {
      const int64_t width = c.intermediate_size;
      scratch_dact.resize(static_cast<size_t>(n * width));
      scratch_dgu.resize(static_cast<size_t>(n * 2 * width));
      swiglu_mlp_backward({n, d, width}, dx.data(), lc.h2.data(), at(params, s.mlp_gate),
                          at(params, s.mlp_down), lc.mlp_gu.data(), lc.mlp_act.data(),
                          dbranch.data(), at(grads, s.mlp_gate), at(grads, s.mlp_down),
                          scratch_dact.data(), scratch_dgu.data(), false);
    } else {
      for (int64_t e = 0; e < c.num_experts; ++e)
        lb_grad[static_cast<size_t>(e)] =
            lb_score_grad_[static_cast<size_t>(i * c.num_experts + e)] * loss_scale;
      moe_.backward(moe_weights(params, i), moe_weights(grads, i), lc.h2.data(), dx.data(), lc.moe,
                    lb_grad.data(), lb_uses_softmax_, z_grad_scale, dbranch.data());
    }
    rmsnorm_backward(dbranch.data(), lc.mid.data(), at(params, s.post_norm), lc.rstd2.data(),
                     dx.data(), at(grads, s.post_norm), n, d, true);
    // Attention branch: mid = x + attn(norm(x)).
    attention_.backward(attention_weights(params, i), attention_weights(grads, i), lc.h1.data(),
                        dx.data(), lc.attention, dbranch.data());
    rmsnorm_backward(dbranch.data(), residual_[static_cast<size_t>(i)].data(),
                     at(params, s.input_norm), lc.rstd1.data(), dx.data(), at(grads, s.input_norm),
                     n, d, true);
    if (layer_grads_ready_) layer_grads_ready_(i);
  }
  embedding_backward(tokens_.data(), dx.data(), at(grads, embed_), n, d);
}

}  // namespace moecore
