#include "model/flop_count.h"

#include "core/check.h"

namespace moecore {

FlopsPerToken flops_per_token(const ModelConfig& c, int64_t seq_len) {
  MOE_CHECK(seq_len > 0, "[flops] seq_len={} must be positive", seq_len);
  const auto f = [](int64_t v) { return static_cast<double>(v); };
  const double d = f(c.hidden_size), layers = f(c.num_hidden_layers);
  const double dense_layers = f(c.first_k_dense_replace), moe_layers = layers - dense_layers;
  FlopsPerToken r;
  // q and o are d x q_size; k and v are d x kv_size.
  r.attention_projections = layers * 6.0 * d * (2.0 * f(c.q_size()) + 2.0 * f(c.kv_size()));
  // QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add x 3 (forward + backward) over the average
  // number of causal positions a token attends to.
  r.attention_scores =
      layers * 12.0 * f(c.num_attention_heads) * f(c.head_size()) * (f(seq_len) + 1.0) / 2.0;
  r.router = moe_layers * 6.0 * d * f(c.num_experts);
  r.experts = moe_layers * 18.0 * d * f(c.moe_intermediate_size) * f(c.num_experts_per_tok);
  r.shared_expert = moe_layers * 18.0 * d * f(c.shared_expert_intermediate_size);
  r.dense_mlp = dense_layers * 18.0 * d * f(c.intermediate_size);
  r.lm_head = 6.0 * d * f(c.vocab_size);
  return r;
}

}  // namespace moecore
