// Model configuration. The [model] table of a config file uses Hugging Face config.json key names,
// so a moecore config and the config.json of an OLMoE / Qwen3-MoE checkpoint say the same thing.
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

enum class QkNorm { kNone, kFull, kPerHead };  // full: OLMoE (over all heads); per_head: Qwen3
// topk_softmax: experts chosen by their softmax probability, weights = softmax over the k
// selected logits (Megatron's "softmax after top-k"; equal to softmax + norm_topk_prob in exact
// arithmetic).
enum class RouterScore { kSoftmax, kSigmoid, kTopkSoftmax };
enum class LbLossStyle { kOlmoCore, kHf };
// What divides the router losses (load-balancing and z): every token of the batch (OLMo-core's
// model default, moecore's default), or the counted labels, targets != -100 (OLMo-core's trainer,
// which passes its label count as loss_div_factor).
enum class LossNormalizer { kTokens, kLabels };
// Over which tokens the (OLMo-core form of the) load-balancing loss weighs routes against scores
// under data parallelism. global: each expert's routes and scores summed over the data-parallel
// group, one loss of the global micro-batch (OLMo-core's global_load_balancing = True). rank:
// each rank's own routes against its own mean scores, the ranks' losses added (OLMo-core's
// default, global_load_balancing = False, lb_loss_granularity local_batch). One rank: the same.
enum class LbLossScope { kGlobal, kRank };
// Which tokens each (OLMo-core form of the) load-balancing term weighs routes against mean scores
// over (OLMo-core's lb_loss_granularity). local_batch: the micro-batch's tokens together, on each
// rank or over the group as lb_loss_scope says. instance: each instance (sequence) alone, its
// routes against its own mean scores, the instances' terms added (OLMo-core's MoE-v2 Qwen and
// GPT-OSS presets). An instance's term is the same on whichever rank it is, so lb_loss_scope does
// not apply to it.
enum class LbLossGranularity { kLocalBatch, kInstance };
// pre: x + attn(norm(x)), then h + ffn(norm(h)) (HF OLMoE, Qwen3-MoE). reordered: OLMo-2's
// x + norm(attn(x)), then h + norm(ffn(h)), no norm before the sublayers (OLMo-core's MoE presets,
// HF FlexOlmo).
enum class BlockNorm { kPre, kReordered };
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
  // Hugging Face's pad_token_id: the embedding row of this token gets no gradient, as in
  // transformers' models (nn.Embedding(padding_idx=pad_token_id)), so a model imported from one
  // fine-tunes as it does there. -1: none (OLMo-core's embedding has no padding row). The row is
  // initialised like the others; only its gradient is zero.
  int64_t pad_token_id = -1;
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
  BlockNorm block_norm = BlockNorm::kPre;
  LossNormalizer loss_normalizer = LossNormalizer::kTokens;
  LbLossScope lb_loss_scope = LbLossScope::kGlobal;
  LbLossGranularity lb_loss_granularity = LbLossGranularity::kLocalBatch;
  // Group-limited top-k (DeepSeek-V3): experts form n_group equal groups, each token keeps the
  // topk_group groups with the highest sum of their top-2 selection scores and picks its k experts
  // inside them. n_group = 1: plain top-k.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;  // constant factor on every routing weight
  // Auxiliary-loss-free balancing: > 0 adds a per-expert bias to the selection scores (not to the
  // weights) and moves it by this rate after each optimizer step (router_bias.h).
  double router_bias_update_rate = 0.0;

  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  int64_t q_size() const { return num_attention_heads * head_size(); }
  int64_t kv_size() const { return num_key_value_heads * head_size(); }
  bool layer_is_dense(int64_t layer) const { return layer < first_k_dense_replace; }
  bool has_router_bias() const { return router_bias_update_rate > 0.0; }
  // Whether each rank makes its load-balancing terms of its own routes and scores (and the
  // selection bias sums the ranks' route tallies): lb_loss_scope "rank", or instance granularity.
  bool lb_terms_per_rank() const {
    return lb_loss_scope == LbLossScope::kRank ||
           lb_loss_granularity == LbLossGranularity::kInstance;
  }

  // Throws moecore::Error naming the first inconsistency.
  void validate() const;
};

}  // namespace moecore
