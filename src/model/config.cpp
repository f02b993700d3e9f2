#include "model/config.h"

#include <cmath>
#include <utility>

#include "core/check.h"

namespace moecore {

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t value) {
    MOE_CHECK(value > 0, "[config] model.{}={} must be positive", key, value);
  };
  // Upper bounds keep every size product inside int64 and name the key instead of failing later in
  // an allocation: token ids are int32, and no single width of a trainable model reaches 2^24.
  auto bounded = [](const char* key, int64_t value, int64_t limit) {
    MOE_CHECK(value <= limit, "[config] model.{}={} is larger than the supported maximum {}", key,
              value, limit);
  };
  constexpr int64_t kMaxWidth = int64_t{1} << 24;
  bounded("vocab_size", vocab_size, int64_t{1} << 31);
  bounded("hidden_size", hidden_size, kMaxWidth);
  bounded("num_hidden_layers", num_hidden_layers, 4096);
  bounded("num_attention_heads", num_attention_heads, 4096);
  bounded("num_key_value_heads", num_key_value_heads, 4096);
  bounded("head_dim", head_dim, 65536);
  bounded("num_experts", num_experts, 65536);
  bounded("moe_intermediate_size", moe_intermediate_size, kMaxWidth);
  bounded("intermediate_size", intermediate_size, kMaxWidth);
  bounded("shared_expert_intermediate_size", shared_expert_intermediate_size, kMaxWidth);
  positive("vocab_size", vocab_size);
  MOE_CHECK(pad_token_id >= -1 && pad_token_id < vocab_size,
            "[config] model.pad_token_id={} must be a token id below vocab_size={} (or -1: none)",
            pad_token_id, vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  MOE_CHECK(head_dim >= 0, "[config] model.head_dim={} must be >= 0 (0 = hidden/heads)", head_dim);
  if (head_dim == 0) {
    MOE_CHECK(hidden_size % num_attention_heads == 0,
              "[attention] num_attention_heads={} does not divide hidden_size={}",
              num_attention_heads, hidden_size);
  }
  MOE_CHECK(num_attention_heads % num_key_value_heads == 0,
            "[attention] num_key_value_heads={} does not divide num_attention_heads={}",
            num_key_value_heads, num_attention_heads);
  MOE_CHECK(head_size() % 2 == 0, "[rope] head_dim={} must be even", head_size());
  // Floats: finite (inf / nan pass a bare `> 0` check or poison every step) and in range.
  for (const auto& [key, value] : {std::pair{"rope_theta", rope_theta},
                                   {"rms_norm_eps", rms_norm_eps},
                                   {"router_aux_loss_coef", router_aux_loss_coef},
                                   {"router_z_loss_coef", router_z_loss_coef}})
    MOE_CHECK(std::isfinite(value), "[config] model.{}={} must be a finite number", key, value);
  MOE_CHECK(rope_theta > 0.0, "[config] model.rope_theta={} must be positive", rope_theta);
  MOE_CHECK(rms_norm_eps > 0.0 && rms_norm_eps < 1.0,
            "[config] model.rms_norm_eps={} must be in (0, 1)", rms_norm_eps);
  MOE_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
            "[config] model.first_k_dense_replace={} must be in [0, num_hidden_layers={}]",
            first_k_dense_replace, num_hidden_layers);
  if (first_k_dense_replace > 0) positive("intermediate_size", intermediate_size);
  if (first_k_dense_replace < num_hidden_layers) {
    positive("num_experts", num_experts);
    positive("num_experts_per_tok", num_experts_per_tok);
    positive("moe_intermediate_size", moe_intermediate_size);
    MOE_CHECK(num_experts_per_tok <= num_experts,
              "[router] num_experts_per_tok={} exceeds num_experts={}", num_experts_per_tok,
              num_experts);
  }
  MOE_CHECK(shared_expert_intermediate_size >= 0,
            "[config] model.shared_expert_intermediate_size={} must be >= 0",
            shared_expert_intermediate_size);
  MOE_CHECK(router_aux_loss_coef >= 0.0, "[config] model.router_aux_loss_coef={} must be >= 0",
            router_aux_loss_coef);
  MOE_CHECK(router_z_loss_coef >= 0.0, "[config] model.router_z_loss_coef={} must be >= 0",
            router_z_loss_coef);
  MOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0,
            "[config] model.routed_scaling_factor={} must be positive", routed_scaling_factor);
  MOE_CHECK(std::isfinite(router_bias_update_rate) && router_bias_update_rate >= 0.0,
            "[config] model.router_bias_update_rate={} must be >= 0 (0 = no expert bias)",
            router_bias_update_rate);
  MOE_CHECK(n_group >= 1, "[config] model.n_group={} must be >= 1", n_group);
  MOE_CHECK(topk_group >= 1 && topk_group <= n_group,
            "[config] model.topk_group={} must be in [1, n_group={}]", topk_group, n_group);
  if (first_k_dense_replace < num_hidden_layers) {
    MOE_CHECK(num_experts % n_group == 0,
              "[router] model.n_group={} does not divide num_experts={}", n_group, num_experts);
    MOE_CHECK(num_experts_per_tok <= topk_group * (num_experts / n_group),
              "[router] num_experts_per_tok={} exceeds the {} experts of topk_group={} groups",
              num_experts_per_tok, topk_group * (num_experts / n_group), topk_group);
  }
  // Random and balanced routing ignore the router's scores when choosing experts: a selection
  // bias or group limit would silently do nothing.
  MOE_CHECK(routing == Routing::kLearned || (n_group == 1 && !has_router_bias()),
            "[config] model.n_group={} / router_bias_update_rate={} need model.routing=\"learned\"",
            n_group, router_bias_update_rate);
  // lb_loss_style "hf" is transformers' load_balancing_loss_func, which counts the plain top-k of
  // the router's softmax. A selection bias, a group limit or non-learned routing takes other
  // experts, so the loss would be neither transformers' nor a loss on the routes taken.
  const char* changes_the_routes = has_router_bias()              ? "router_bias_update_rate"
                                   : n_group > 1                  ? "n_group"
                                   : routing != Routing::kLearned ? "routing"
                                                                  : nullptr;
  MOE_CHECK(lb_loss_style != LbLossStyle::kHf || changes_the_routes == nullptr,
            "[config] model.lb_loss_style=\"hf\" (transformers' load_balancing_loss_func) counts "
            "the plain top-k of the router's scores, which model.{} changes: use "
            "lb_loss_style=\"olmo-core\" (the routes taken)",
            changes_the_routes == nullptr ? "" : changes_the_routes);
  // The labels normaliser is OLMo-core's trainer's, defined for its per-layer loss.
  MOE_CHECK(loss_normalizer == LossNormalizer::kTokens || lb_loss_style == LbLossStyle::kOlmoCore,
            "[config] model.loss_normalizer=\"labels\" needs model.lb_loss_style=\"olmo-core\"");
  // transformers' form is one loss of all layers' routes over the batch; its ranks' terms do
  // not add up to a loss of the global batch.
  MOE_CHECK(lb_loss_scope == LbLossScope::kGlobal || lb_loss_style == LbLossStyle::kOlmoCore,
            "[config] model.lb_loss_scope=\"rank\" needs model.lb_loss_style=\"olmo-core\"");
  MOE_CHECK(lb_loss_granularity == LbLossGranularity::kLocalBatch ||
                lb_loss_style == LbLossStyle::kOlmoCore,
            "[config] model.lb_loss_granularity=\"instance\" needs "
            "model.lb_loss_style=\"olmo-core\"");
}

}  // namespace moecore
