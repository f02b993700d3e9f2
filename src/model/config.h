// Model configuration. The [model] table of a config file uses Hugging Face config.json key names,
// so a moecore config and the config.json of an OLMoE / Qwen3-MoE checkpoint say the same thing.
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

enum class QkNorm { kNone, kFull, kPerHead };  // full: OLMoE (over all heads); per_head: Qwen3
enum class RouterScore { kSoftmax, kSigmoid };
enum class LbLossStyle { kOlmoCore, kHf };
// How each token's k experts are chosen (capacity benchmarks): learned = top-k of the router
// scores; random = top-k of uniform random scores; balanced = a deterministic even spread. The
// routing weights are the router's scores of the chosen experts in every mode (see router.h).
enum class Routing { kLearned, kRandom, kBalanced };

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t num_experts = 8;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 256;
  int64_t intermediate_size = 512;  // width of the dense MLP layers
  int64_t first_k_dense_replace = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool norm_topk_prob = false;
  double router_aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.0;
  QkNorm qk_norm = QkNorm::kFull;
  RouterScore router_score = RouterScore::kSoftmax;
  LbLossStyle lb_loss_style = LbLossStyle::kOlmoCore;
  Routing routing = Routing::kLearned;  // not a Hugging Face key: moecore's own

  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  int64_t q_size() const { return num_attention_heads * head_size(); }
  int64_t kv_size() const { return num_key_value_heads * head_size(); }
  bool layer_is_dense(int64_t layer) const { return layer < first_k_dense_replace; }

  // Throws moecore::Error naming the first inconsistency.
  void validate() const;
};

}  // namespace moecore
