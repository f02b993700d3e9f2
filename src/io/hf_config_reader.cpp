#include "io/hf_config_reader.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "io/json_excerpt.h"

namespace moecore::io {

namespace {

// Typed access to config.json's keys; every error names the file and the key. An absent key and
// a null one mean the same (transformers writes None as null).
class ConfigKeys {
 public:
  ConfigKeys(const nlohmann::json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const nlohmann::json& raw(const char* key) const {
    static const nlohmann::json kAbsent;  // null: a const json's operator[] must not miss
    return j_.contains(key) ? j_[key] : kAbsent;
  }

  int64_t integer(const char* key) const {
    MOE_CHECK(has(key), "[import] {}: missing key '{}'", origin_, key);
    MOE_CHECK(j_[key].is_number_integer(), "[import] {}: '{}' is {}, expected an integer", origin_,
              key, json_excerpt(j_[key]));
    return j_[key].get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number(const char* key) const {
    MOE_CHECK(has(key), "[import] {}: missing key '{}'", origin_, key);
    MOE_CHECK(j_[key].is_number(), "[import] {}: '{}' is {}, expected a number", origin_, key,
              json_excerpt(j_[key]));
    return j_[key].get<double>();
  }
  double number(const char* key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    MOE_CHECK(j_[key].is_boolean(), "[import] {}: '{}' is {}, expected true or false", origin_, key,
              json_excerpt(j_[key]));
    return j_[key].get<bool>();
  }
  // A key whose only value moecore computes is its absence (or null) or `expected`.
  void require_absent(const char* key, const char* why) const {
    MOE_CHECK(!has(key), "[import] {}: '{}' = {} is not supported ({})", origin_, key,
              json_excerpt(j_[key]), why);
  }
  void require_value(const char* key, const nlohmann::json& expected, const char* why) const {
    MOE_CHECK(!has(key) || j_[key] == expected, "[import] {}: '{}' = {} is not supported ({})",
              origin_, key, json_excerpt(j_[key]), why);
  }
  template <typename Enum>
  Enum choice(const char* key, Enum fallback,
              std::initializer_list<std::pair<const char*, Enum>> names) const {
    if (!has(key)) return fallback;
    MOE_CHECK(j_[key].is_string(), "[import] {}: '{}' is {}, expected a string", origin_, key,
              json_excerpt(j_[key]));
    const std::string value = j_[key].get<std::string>();
    for (const auto& [name, e] : names)
      if (value == name) return e;
    fail("[import] {}: '{}' = '{}' is not a value moecore knows", origin_, key, value);
  }
  const std::string& origin() const { return origin_; }

 private:
  const nlohmann::json& j_;
  std::string origin_;
};

// ModelConfig::validate's error, naming config.json.
void validate(const ConfigKeys& k, const ModelConfig& m) {
  try {
    m.validate();
  } catch (const Error& e) {
    fail("[import] {}: {}", k.origin(), e.what());
  }
}

// The keys OLMoE, Qwen3-MoE and FlexOlmo share (transformers' defaults where one may be absent).
void read_common(const ConfigKeys& k, ModelConfig& m) {
  m.vocab_size = k.integer("vocab_size");
  m.hidden_size = k.integer("hidden_size");
  m.num_hidden_layers = k.integer("num_hidden_layers");
  m.num_attention_heads = k.integer("num_attention_heads");
  // transformers: None means multi-head attention.
  m.num_key_value_heads = k.integer("num_key_value_heads", m.num_attention_heads);
  // Absent in transformers 5.x configs, whose rope_parameters hold it (read below).
  const nlohmann::json& rope_parameters = k.raw("rope_parameters");
  m.rope_theta =
      k.has("rope_theta") || !rope_parameters.is_object() || !rope_parameters.contains("rope_theta")
          ? k.number("rope_theta")
          : 0.0;
  m.rms_norm_eps = k.number("rms_norm_eps");
  m.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
  m.num_experts = k.integer("num_experts");
  m.num_experts_per_tok = k.integer("num_experts_per_tok");
  m.norm_topk_prob = k.boolean("norm_topk_prob", false);
  m.router_aux_loss_coef = k.number("router_aux_loss_coef", m.router_aux_loss_coef);
  m.router_z_loss_coef = k.number("router_z_loss_coef", m.router_z_loss_coef);  // moecore's key
  // transformers 4.x says rope_scaling, 5.x rope_parameters (with rope_theta inside); either may
  // name the unscaled "default" rope type.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!k.has(key)) continue;
    const nlohmann::json& rope = k.raw(key);
    const char* type_key = rope.is_object() && rope.contains("rope_type") ? "rope_type" : "type";
    const bool unscaled =
        rope.is_object() && rope.contains(type_key) && rope[type_key] == nlohmann::json("default");
    MOE_CHECK(unscaled,
              "[import] {}: '{}' = {} is not supported (moecore's RoPE is unscaled: only "
              "rope_type \"default\")",
              k.origin(), key, json_excerpt(rope));
    for (const auto& [name, value] : rope.items())
      MOE_CHECK(name == "rope_type" || name == "type" || name == "rope_theta",
                "[import] {}: '{}' holds '{}' = {}, which moecore's unscaled RoPE does not read",
                k.origin(), key, name, json_excerpt(value));
    if (rope.contains("rope_theta")) {
      MOE_CHECK(rope["rope_theta"].is_number(),
                "[import] {}: '{}.rope_theta' is {}, expected a number", k.origin(), key,
                json_excerpt(rope["rope_theta"]));
      const double theta = rope["rope_theta"].get<double>();
      MOE_CHECK(!k.has("rope_theta") || k.number("rope_theta") == theta,
                "[import] {}: 'rope_theta' = {} and '{}.rope_theta' = {} differ", k.origin(),
                k.number("rope_theta"), key, theta);
      m.rope_theta = theta;
    }
  }
  k.require_value("attention_bias", false, "moecore's projections have no bias");
  k.require_value("partial_rotary_factor", 1.0, "moecore's RoPE rotates the whole head");
  // transformers 4.5x+: one entry per layer; moecore's attention is full causal in every layer.
  if (k.has("layer_types")) {
    const nlohmann::json& types = k.raw("layer_types");
    MOE_CHECK(types.is_array(), "[import] {}: 'layer_types' is {}, expected a list", k.origin(),
              json_excerpt(types));
    for (const nlohmann::json& type : types)
      MOE_CHECK(type == "full_attention",
                "[import] {}: 'layer_types' holds {}, not supported (moecore's attention is full "
                "causal: only \"full_attention\")",
                k.origin(), json_excerpt(type));
  }
  // transformers' ACT2FN: "swish" is the same function as "silu".
  MOE_CHECK(!k.has("hidden_act") || k.raw("hidden_act") == "silu" || k.raw("hidden_act") == "swish",
            "[import] {}: 'hidden_act' = {} is not supported (moecore's MLPs are SwiGLU: silu)",
            k.origin(), json_excerpt(k.raw("hidden_act")));
  // Training-time only, but `train --init-from` trains: without it the run is another one.
  k.require_value("attention_dropout", 0.0, "moecore's attention has no dropout");
}

// OLMoE and FlexOlmo (OLMoE with OLMo-2's reordered norms): QK-norm over the whole projection,
// `intermediate_size` is the expert width, no dense layer.
ModelConfig olmoe_family(const ConfigKeys& k, BlockNorm block_norm) {
  ModelConfig m;
  read_common(k, m);
  m.moe_intermediate_size = k.integer("intermediate_size");
  m.intermediate_size = m.moe_intermediate_size;  // unused: no dense layer
  m.qk_norm = QkNorm::kFull;
  m.block_norm = block_norm;
  // FlexOlmo's attention takes head_dim where config.json has it (absent: hidden_size / heads).
  // OLMoE's rotary embedding (transformers 4.57) is sized by a head_dim key while its attention is
  // hidden_size / heads: one that differs is a model transformers cannot run, not one to guess at.
  if (block_norm == BlockNorm::kReordered) {
    m.head_dim = k.integer("head_dim", 0);
  } else if (k.has("head_dim")) {
    MOE_CHECK(
        m.num_attention_heads > 0 && k.integer("head_dim") * m.num_attention_heads == m.hidden_size,
        "[import] {}: 'head_dim' = {} is not supported for olmoe (its attention is "
        "hidden_size / num_attention_heads = {} / {})",
        k.origin(), k.integer("head_dim"), m.hidden_size, m.num_attention_heads);
  }
  k.require_absent("clip_qkv", "moecore does not clamp q, k and v");
  return m;
}

ModelConfig qwen3_moe(const ConfigKeys& k) {
  ModelConfig m;
  read_common(k, m);
  // Qwen3MoeConfig's default is 4 key/value heads (OlmoeConfig's and FlexOlmoConfig's: the heads).
  m.num_key_value_heads = k.integer("num_key_value_heads", 4);
  m.head_dim = k.integer("head_dim", 0);  // transformers: absent means hidden_size / heads
  // Qwen3MoeConfig's default, where OlmoeConfig's and FlexOlmoConfig's are moecore's 0.01.
  m.router_aux_loss_coef = k.number("router_aux_loss_coef", 0.001);
  m.moe_intermediate_size = k.integer("moe_intermediate_size");
  m.intermediate_size = k.integer("intermediate_size");
  m.qk_norm = QkNorm::kPerHead;
  k.require_value("use_sliding_window", false, "moecore's attention is full causal");
  // transformers: layer i is dense when listed in mlp_only_layers or when i + 1 is not a multiple
  // of decoder_sparse_step; moecore's dense layers are the first first_k_dense_replace.
  validate(k, m);  // bounds num_hidden_layers before the loop over the layers below
  const int64_t step = k.integer("decoder_sparse_step", 1);
  MOE_CHECK(step >= 1, "[import] {}: 'decoder_sparse_step' = {} must be >= 1", k.origin(), step);
  std::set<int64_t> only_mlp;
  if (k.has("mlp_only_layers")) {
    const nlohmann::json& list = k.raw("mlp_only_layers");
    MOE_CHECK(list.is_array(), "[import] {}: 'mlp_only_layers' is {}, expected a list of layers",
              k.origin(), json_excerpt(list));
    for (const nlohmann::json& layer : list) {
      MOE_CHECK(layer.is_number_integer(),
                "[import] {}: 'mlp_only_layers' holds {}, expected layer indices", k.origin(),
                json_excerpt(layer));
      only_mlp.insert(layer.get<int64_t>());
    }
  }
  int64_t dense_prefix = 0;
  bool prefix = true;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    const bool dense = only_mlp.count(i) != 0 || (i + 1) % step != 0;
    if (dense && prefix) {
      ++dense_prefix;
    } else if (dense) {
      fail(
          "[import] {}: layer {} is dense after a sparse one ('mlp_only_layers', "
          "'decoder_sparse_step'); moecore's dense layers are a prefix",
          k.origin(), i);
    } else {
      prefix = false;
    }
  }
  m.first_k_dense_replace = dense_prefix;
  return m;
}

// moecore's own export for architectures no transformers class computes (io/hf_config.h).
ModelConfig moecore_own(const ConfigKeys& k) {
  ModelConfig m;
  read_common(k, m);
  m.head_dim = k.integer("head_dim", 0);
  m.moe_intermediate_size = k.integer("moe_intermediate_size");
  m.intermediate_size = k.integer("intermediate_size");
  m.first_k_dense_replace = k.integer("first_k_dense_replace", 0);
  m.shared_expert_intermediate_size = k.integer("shared_expert_intermediate_size", 0);
  m.qk_norm =
      k.choice("qk_norm", QkNorm::kFull,
               {{"none", QkNorm::kNone}, {"full", QkNorm::kFull}, {"per_head", QkNorm::kPerHead}});
  m.router_score = k.choice("router_score", RouterScore::kSoftmax,
                            {{"softmax", RouterScore::kSoftmax},
                             {"sigmoid", RouterScore::kSigmoid},
                             {"topk_softmax", RouterScore::kTopkSoftmax}});
  m.block_norm = k.choice("block_norm", BlockNorm::kPre,
                          {{"pre", BlockNorm::kPre}, {"reordered", BlockNorm::kReordered}});
  m.routing = k.choice("routing", Routing::kLearned,
                       {{"learned", Routing::kLearned},
                        {"random", Routing::kRandom},
                        {"balanced", Routing::kBalanced}});
  m.n_group = k.integer("n_group", 1);
  m.topk_group = k.integer("topk_group", 1);
  m.routed_scaling_factor = k.number("routed_scaling_factor", 1.0);
  m.router_bias_update_rate = k.number("router_bias_update_rate", 0.0);
  return m;
}

}  // namespace

std::optional<std::vector<int32_t>> eos_token_ids_from_json(const nlohmann::json& eos,
                                                            const std::string& origin,
                                                            int64_t vocab_size, const char* tag) {
  if (eos.is_null()) return std::nullopt;
  // An id outside the vocabulary is an error, in config.json as in generation_config.json:
  // transformers' generate accepts it, but no sampled token ever equals it, so the model never
  // stops where the file says it does (transformers itself only warns that generation "will not
  // stop" for a negative one). Such an id comes from another tokenizer or vocabulary; leaving it
  // out would hide that.
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
    MOE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size,
              "{} {}: eos_token_id holds {}, not a token id below vocab_size={}", tag, origin,
              json_excerpt(id), vocab_size);
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

HfModelInfo hf_model_info_from_json(const nlohmann::json& config, const std::string& origin,
                                    int64_t vocab_size) {
  MOE_CHECK(config.is_object(), "[import] {}: not a JSON object", origin);
  const ConfigKeys k(config, origin);
  HfModelInfo info;
  info.max_position_embeddings = k.integer("max_position_embeddings", 0);
  const auto in_vocabulary = [vocab_size](const nlohmann::json& id) {
    return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size;
  };
  info.eos_token_ids =
      eos_token_ids_from_json(k.raw("eos_token_id"), origin, vocab_size, "[import]");
  // BOS decides nothing moecore computes: an id beyond the vocabulary names no token and is left
  // out. (PAD is the model's: hf_model_config_from_json.)
  if (k.has("bos_token_id") && in_vocabulary(k.raw("bos_token_id")))
    info.bos_token_id = k.raw("bos_token_id").get<int32_t>();
  info.output_router_logits = k.boolean("output_router_logits", false);
  return info;
}

HfModelConfig hf_model_config_from_json(const nlohmann::json& config, const std::string& origin) {
  MOE_CHECK(config.is_object(), "[import] {}: not a JSON object", origin);
  const ConfigKeys k(config, origin);
  MOE_CHECK(k.has("model_type") && config["model_type"].is_string(),
            "[import] {}: no 'model_type' string", origin);
  HfModelConfig out;
  out.model_type = config["model_type"].get<std::string>();
  if (out.model_type == "olmoe") {
    out.model = olmoe_family(k, BlockNorm::kPre);
  } else if (out.model_type == "flex_olmo") {
    out.model = olmoe_family(k, BlockNorm::kReordered);
  } else if (out.model_type == "qwen3_moe") {
    out.model = qwen3_moe(k);
  } else if (out.model_type == "moecore") {
    out.model = moecore_own(k);
  } else {
    fail(
        "[import] {}: model_type '{}' is not supported (expected olmoe, qwen3_moe, flex_olmo or "
        "moecore)",
        origin, out.model_type);
  }
  // transformers' embedding has no gradient in the pad token's row (padding_idx); an id beyond the
  // vocabulary (Llama's -1 for "none") names no token and means none.
  if (k.has("pad_token_id")) {
    const nlohmann::json& pad = k.raw("pad_token_id");
    MOE_CHECK(pad.is_number_integer(), "[import] {}: 'pad_token_id' is {}, expected an integer",
              origin, json_excerpt(pad));
    const int64_t id = pad.get<int64_t>();
    out.model.pad_token_id = id >= 0 && id < out.model.vocab_size ? id : -1;
  }
  validate(k, out.model);
  out.info = hf_model_info_from_json(config, origin, out.model.vocab_size);
  return out;
}

ModelConfig canonical_architecture(ModelConfig m) {
  if (m.head_dim == m.hidden_size / m.num_attention_heads) m.head_dim = 0;
  if (m.first_k_dense_replace == 0) m.intermediate_size = 0;
  return m;
}

namespace {

nlohmann::json read_config_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[import] cannot open {}", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail("[import] {}: malformed JSON: {}", path, e.what());
  }
}

}  // namespace

HfModelConfig read_hf_model_config(const std::string& dir) {
  MOE_CHECK(std::filesystem::is_directory(dir), "[import] '{}' is not a directory", dir);
  const std::string path = dir + "/config.json";
  MOE_CHECK(std::filesystem::is_regular_file(path), "[import] {} does not exist", path);
  return hf_model_config_from_json(read_config_json(path), path);
}

std::optional<HfModelInfo> read_hf_model_info(const std::string& dir, int64_t vocab_size) {
  const std::string path = dir + "/config.json";
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  return hf_model_info_from_json(read_config_json(path), path, vocab_size);
}

}  // namespace moecore::io
