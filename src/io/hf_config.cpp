#include "io/hf_config.h"

namespace moecore::io {

namespace {

nlohmann::json token_id_or_null(std::optional<int32_t> id) {
  return id ? nlohmann::json(*id) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json hf_config_json(const ModelConfig& c, int64_t max_position_embeddings,
                              std::optional<int32_t> eos_token_id) {
  HfModelInfo info;
  info.max_position_embeddings = max_position_embeddings;
  if (eos_token_id) info.eos_token_ids = std::vector<int32_t>{*eos_token_id};
  return hf_config_json(c, info);
}

nlohmann::json hf_config_json(const ModelConfig& c, const HfModelInfo& info) {
  // transformers writes one EOS as an integer and several (or none) as a list.
  const nlohmann::json eos = !info.eos_token_ids ? nlohmann::json(nullptr)
                             : info.eos_token_ids->size() == 1
                                 ? nlohmann::json(info.eos_token_ids->front())
                                 : nlohmann::json(*info.eos_token_ids);
  nlohmann::json j = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"num_experts", c.num_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"norm_topk_prob", c.norm_topk_prob},
      {"router_aux_loss_coef", c.router_aux_loss_coef},
      // Not a transformers key (its classes ignore it): moecore's import reads it back, so a
      // model exported and imported again trains with the same z-loss.
      {"router_z_loss_coef", c.router_z_loss_coef},
      {"output_router_logits", info.output_router_logits},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"max_position_embeddings", info.max_position_embeddings},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"pad_token_id",
       c.pad_token_id >= 0 ? nlohmann::json(c.pad_token_id) : nlohmann::json(nullptr)},
      {"bos_token_id", token_id_or_null(info.bos_token_id)},
      {"eos_token_id", eos},
      {"torch_dtype", "float32"},
  };
  // Random or balanced routing is not what transformers' OLMoE / Qwen3-MoE would run: such a
  // model claims no Hugging Face architecture.
  // Nor are a selection bias, group-limited top-k, a weight scale or top-k softmax gating (the
  // last equals softmax + norm_topk_prob only in exact arithmetic).
  const bool hf_router = c.router_score == RouterScore::kSoftmax &&
                         c.shared_expert_intermediate_size == 0 && c.routing == Routing::kLearned &&
                         !c.has_router_bias() && c.n_group == 1 && c.routed_scaling_factor == 1.0;
  const bool pre_norm = c.block_norm == BlockNorm::kPre;
  const bool olmoe_shape = hf_router && c.qk_norm == QkNorm::kFull && c.first_k_dense_replace == 0;
  const bool standard_head = c.head_size() * c.num_attention_heads == c.hidden_size;
  const bool olmoe = olmoe_shape && pre_norm && standard_head;
  // FlexOlmo (transformers >= 4.57) is OLMoE with OLMo-2's reordered norms: the same attention
  // (QK-norm over the whole projection; head_dim read where config.json has one), router and
  // experts, post_attention_layernorm after attention and post_feedforward_layernorm after the MoE.
  const bool flex_olmo = olmoe_shape && !pre_norm;
  const bool qwen3 = hf_router && c.qk_norm == QkNorm::kPerHead && pre_norm;
  if (flex_olmo) {
    j["architectures"] = {"FlexOlmoForCausalLM"};
    j["model_type"] = "flex_olmo";
    j["intermediate_size"] = c.moe_intermediate_size;
    if (!standard_head) j["head_dim"] = c.head_size();
  } else if (olmoe) {
    j["architectures"] = {"OlmoeForCausalLM"};
    j["model_type"] = "olmoe";
    j["intermediate_size"] = c.moe_intermediate_size;
    j["clip_qkv"] = nullptr;
  } else if (qwen3) {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["model_type"] = "qwen3_moe";
    j["head_dim"] = c.head_size();
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["intermediate_size"] = c.intermediate_size;
    j["decoder_sparse_step"] = 1;
    std::vector<int64_t> dense_layers;
    for (int64_t i = 0; i < c.first_k_dense_replace; ++i) dense_layers.push_back(i);
    j["mlp_only_layers"] = dense_layers;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else {
    j["architectures"] = nlohmann::json::array();
    j["model_type"] = "moecore";
    j["head_dim"] = c.head_size();
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["intermediate_size"] = c.intermediate_size;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["qk_norm"] = c.qk_norm == QkNorm::kNone   ? "none"
                   : c.qk_norm == QkNorm::kFull ? "full"
                                                : "per_head";
    j["router_score"] = c.router_score == RouterScore::kSoftmax   ? "softmax"
                        : c.router_score == RouterScore::kSigmoid ? "sigmoid"
                                                                  : "topk_softmax";
    j["block_norm"] = pre_norm ? "pre" : "reordered";
    // DeepSeek-V3's keys; the bias itself is model.layers.{i}.mlp.gate.e_score_correction_bias.
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["router_bias_update_rate"] = c.router_bias_update_rate;
    j["routing"] = c.routing == Routing::kLearned  ? "learned"
                   : c.routing == Routing::kRandom ? "random"
                                                   : "balanced";
  }
  return j;
}

}  // namespace moecore::io
