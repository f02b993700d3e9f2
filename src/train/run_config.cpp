#include "train/run_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "core/check.h"
#include "core/escape.h"
#include "data/token_dataset.h"
#include "optim/lr_schedule.h"

namespace moecore {

namespace {

// Reads the keys of one table into typed fields; reports unknown keys and type mismatches.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string section, std::string source)
      : table_(table), section_(std::move(section)), source_(std::move(source)) {}

  template <typename T>
  void read(const char* key, T& field) {
    seen_.emplace_back(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if constexpr (std::is_same_v<T, bool>) {
      auto value = node->value_exact<bool>();
      MOE_CHECK(value.has_value(), "[config] {}: {}.{} must be a boolean", source_, section_, key);
      field = *value;
    } else if constexpr (std::is_integral_v<T>) {
      auto value = node->value_exact<int64_t>();
      MOE_CHECK(value.has_value(), "[config] {}: {}.{} must be an integer", source_, section_, key);
      // No wrap-around: a negative train.seed is an error, not 2^64 - 1.
      MOE_CHECK(std::in_range<T>(*value), "[config] {}: {}.{}={} is out of range [{}, {}]", source_,
                section_, key, *value, std::numeric_limits<T>::min(),
                std::numeric_limits<T>::max());
      field = static_cast<T>(*value);
    } else if constexpr (std::is_floating_point_v<T>) {
      auto value = node->value<double>();  // integers are accepted for float keys
      MOE_CHECK(value.has_value() && (node->is_floating_point() || node->is_integer()),
                "[config] {}: {}.{} must be a number", source_, section_, key);
      // TOML spells inf and nan; no key of a run means either (each key's range is checked after).
      MOE_CHECK(std::isfinite(*value), "[config] {}: {}.{}={} must be a finite number", source_,
                section_, key, *value);
      field = *value;
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      field.clear();
      const toml::array* array = node->as_array();
      MOE_CHECK(array != nullptr, "[config] {}: {}.{} must be a list of integers", source_,
                section_, key);
      for (const toml::node& item : *array) {
        auto value = item.value_exact<int64_t>();
        MOE_CHECK(value.has_value(), "[config] {}: {}.{} must be a list of integers", source_,
                  section_, key);
        field.push_back(*value);
      }
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      field.clear();
      const toml::array* array = node->as_array();
      MOE_CHECK(array != nullptr, "[config] {}: {}.{} must be a list of numbers", source_, section_,
                key);
      for (const toml::node& item : *array) {
        auto value = item.value<double>();  // integers are accepted, as for a float key
        MOE_CHECK(value.has_value() && (item.is_floating_point() || item.is_integer()),
                  "[config] {}: {}.{} must be a list of numbers", source_, section_, key);
        MOE_CHECK(std::isfinite(*value), "[config] {}: {}.{} holds {}: must be finite numbers",
                  source_, section_, key, *value);
        field.push_back(*value);
      }
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      double value = 0.0;
      read(key, value);  // a number, as a float key
      field = value;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      // A list of strings; a single string is accepted as a list of one.
      field.clear();
      if (auto single = node->value_exact<std::string>()) {
        field.push_back(*single);
        return;
      }
      const toml::array* array = node->as_array();
      MOE_CHECK(array != nullptr, "[config] {}: {}.{} must be a string or a list of strings",
                source_, section_, key);
      for (const toml::node& item : *array) {
        auto text = item.value_exact<std::string>();
        MOE_CHECK(text.has_value(), "[config] {}: {}.{} must be a list of strings", source_,
                  section_, key);
        field.push_back(*text);
      }
    } else {
      auto value = node->value_exact<std::string>();
      MOE_CHECK(value.has_value(), "[config] {}: {}.{} must be a string", source_, section_, key);
      field = *value;
    }
  }

  template <typename Enum>
  void read_enum(const char* key, Enum& field,
                 const std::vector<std::pair<const char*, Enum>>& choices) {
    std::string text;
    read(key, text);
    if (table_.get(key) == nullptr) return;
    std::string allowed;
    for (const auto& [name, value] : choices) {
      if (text == name) {
        field = value;
        return;
      }
      allowed +=
          allowed.empty() ? std::string("\"") + name + "\"" : std::string(", \"") + name + "\"";
    }
    fail("[config] {}: {}.{}=\"{}\" is not one of {}", source_, section_, key, text, allowed);
  }

  // The node under `key` (null when absent), for a sub-table or an array of tables that a reader
  // of its own reads.
  const toml::node* node(const char* key) {
    seen_.emplace_back(key);
    return table_.get(key);
  }

  bool has(const char* key) const { return table_.get(key) != nullptr; }

  const std::string& section() const { return section_; }

  const std::string& source() const { return source_; }

  void reject_unknown() const {
    for (const auto& [key, node] : table_) {
      const std::string name(key.str());
      bool known = false;
      for (const std::string& s : seen_) known = known || s == name;
      MOE_CHECK(known, "[config] {}: unknown key {}.{}", source_, section_, name);
    }
  }

 private:
  const toml::table& table_;
  std::string section_, source_;
  std::vector<std::string> seen_;
};

// Each table of the array of tables `key` ([[<section>.key]]; none when absent), read by
// read_entry(reader) from a reader that names it <section>.key[i] in its errors and refuses the
// keys read_entry did not read. `required` (or nullptr): a key every table must give, its
// absence an error saying "names no <what>".
template <typename ReadEntry>
void read_array_of_tables(TableReader& r, const char* key, const char* required, const char* what,
                          ReadEntry&& read_entry) {
  const toml::node* node = r.node(key);
  if (node == nullptr) return;
  const std::string name = r.section() + "." + key;
  const toml::array* array = node->as_array();
  MOE_CHECK(array != nullptr && (array->empty() || array->is_array_of_tables()),
            "[config] {}: {} must be an array of tables ([[{}]])", r.source(), name, name);
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string where = fmt::format("{}[{}]", name, i);
    TableReader entry_reader(*array->get(i)->as_table(), where, r.source());
    MOE_CHECK(required == nullptr || entry_reader.has(required), "[config] {}: {} names no {}",
              r.source(), where, what);
    read_entry(entry_reader);
    entry_reader.reject_unknown();
  }
}

void read_model(TableReader& r, ModelConfig& m) {
  r.read("vocab_size", m.vocab_size);
  r.read("hidden_size", m.hidden_size);
  r.read("num_hidden_layers", m.num_hidden_layers);
  r.read("num_attention_heads", m.num_attention_heads);
  r.read("num_key_value_heads", m.num_key_value_heads);
  r.read("head_dim", m.head_dim);
  r.read("rope_theta", m.rope_theta);
  r.read("rms_norm_eps", m.rms_norm_eps);
  r.read("tie_word_embeddings", m.tie_word_embeddings);
  r.read("pad_token_id", m.pad_token_id);
  r.read("num_experts", m.num_experts);
  r.read("num_experts_per_tok", m.num_experts_per_tok);
  r.read("moe_intermediate_size", m.moe_intermediate_size);
  r.read("intermediate_size", m.intermediate_size);
  r.read("first_k_dense_replace", m.first_k_dense_replace);
  r.read("shared_expert_intermediate_size", m.shared_expert_intermediate_size);
  r.read("norm_topk_prob", m.norm_topk_prob);
  r.read("router_aux_loss_coef", m.router_aux_loss_coef);
  r.read("router_z_loss_coef", m.router_z_loss_coef);
  r.read_enum("qk_norm", m.qk_norm,
              {{"none", QkNorm::kNone}, {"full", QkNorm::kFull}, {"per_head", QkNorm::kPerHead}});
  r.read_enum("router_score", m.router_score,
              {{"softmax", RouterScore::kSoftmax},
               {"sigmoid", RouterScore::kSigmoid},
               {"topk_softmax", RouterScore::kTopkSoftmax}});
  r.read_enum("lb_loss_style", m.lb_loss_style,
              {{"olmo-core", LbLossStyle::kOlmoCore}, {"hf", LbLossStyle::kHf}});
  r.read_enum("lb_loss_scope", m.lb_loss_scope,
              {{"global", LbLossScope::kGlobal}, {"rank", LbLossScope::kRank}});
  r.read_enum("lb_loss_granularity", m.lb_loss_granularity,
              {{"local_batch", LbLossGranularity::kLocalBatch},
               {"instance", LbLossGranularity::kInstance}});
  r.read_enum("routing", m.routing,
              {{"learned", Routing::kLearned},
               {"random", Routing::kRandom},
               {"balanced", Routing::kBalanced}});
  r.read_enum("block_norm", m.block_norm,
              {{"pre", BlockNorm::kPre}, {"reordered", BlockNorm::kReordered}});
  r.read_enum("loss_normalizer", m.loss_normalizer,
              {{"tokens", LossNormalizer::kTokens}, {"labels", LossNormalizer::kLabels}});
  r.read("n_group", m.n_group);
  r.read("topk_group", m.topk_group);
  r.read("routed_scaling_factor", m.routed_scaling_factor);
  r.read("router_bias_update_rate", m.router_bias_update_rate);
}

// [[optim.stages]] and [optim.override_decay] (the "composable" schedule).
void read_lr_shape(TableReader& r, LrShape& shape) {
  r.read_enum("shape", shape, {{"linear", LrShape::kLinear}, {"cosine", LrShape::kCosine}});
}

void read_lr_stages(TableReader& r, OptimConfig& o) {
  read_array_of_tables(r, "stages", nullptr, "", [&o](TableReader& stage_reader) {
    LrStage stage;
    stage_reader.read("duration", stage.duration);
    read_lr_shape(stage_reader, stage.shape);
    stage_reader.read("start_lr", stage.start_lr);
    stage_reader.read("start_lr_fraction", stage.start_lr_fraction);
    stage_reader.read("end_lr", stage.end_lr);
    stage_reader.read("end_lr_fraction", stage.end_lr_fraction);
    o.stages.push_back(stage);
  });
  if (const toml::node* node = r.node("override_decay")) {
    const toml::table* table = node->as_table();
    MOE_CHECK(table != nullptr, "[config] {}: {}.override_decay must be a table", r.source(),
              r.section());
    TableReader decay_reader(*table, r.section() + ".override_decay", r.source());
    LrOverrideDecay decay;
    decay_reader.read("start", decay.start);
    decay_reader.read("duration", decay.duration);
    read_lr_shape(decay_reader, decay.shape);
    decay_reader.read("end_lr", decay.end_lr);
    decay_reader.read("end_lr_fraction", decay.end_lr_fraction);
    decay_reader.reject_unknown();
    o.override_decay = decay;
  }
}

// The keys of one learning-rate schedule: [optim]'s, or an [[optim.sequence]] entry's (which
// may not itself be "sequential").
constexpr std::array<const char*, 17> kScheduleKeys = {
    "warmup_steps",       "warmup_tokens",  "warmup_fraction",
    "warmup_min_lr",      "min_lr_ratio",   "decay_steps",
    "decay_tokens",       "decay_fraction", "decay_min_lr_ratio",
    "power_exponent",     "t_max_steps",    "t_max_tokens",
    "period_steps",       "period_tokens",  "period_lr_multipliers",
    "exponential_lr_min", "stages"};

void read_schedule(TableReader& r, OptimConfig& o, bool in_sequence) {
  r.read("warmup_steps", o.warmup_steps);
  r.read("warmup_tokens", o.warmup_tokens);
  r.read("warmup_fraction", o.warmup_fraction);
  r.read("warmup_min_lr", o.warmup_min_lr);
  std::vector<std::pair<const char*, LrSchedule>> names = {
      {"cosine", LrSchedule::kCosine},
      {"linear", LrSchedule::kLinear},
      {"constant", LrSchedule::kConstant},
      {"wsd", LrSchedule::kWsd},
      {"inv_sqrt", LrSchedule::kInvSqrt},
      {"half_cos", LrSchedule::kHalfCosine},
      {"cosine_linear_decay", LrSchedule::kCosineLinearDecay},
      {"power", LrSchedule::kPower},
      {"wsds", LrSchedule::kWsds},
      {"exponential", LrSchedule::kExponential},
      {"composable", LrSchedule::kComposable}};
  if (!in_sequence) names.emplace_back("sequential", LrSchedule::kSequential);
  r.read_enum("schedule", o.schedule, names);
  r.read("min_lr_ratio", o.min_lr_ratio);
  r.read("decay_steps", o.decay_steps);
  r.read("decay_tokens", o.decay_tokens);
  r.read("decay_fraction", o.decay_fraction);
  r.read("decay_min_lr_ratio", o.decay_min_lr_ratio);
  r.read("power_exponent", o.power_exponent);
  r.read("t_max_steps", o.t_max_steps);
  r.read("t_max_tokens", o.t_max_tokens);
  r.read("period_steps", o.period_steps);
  r.read("period_tokens", o.period_tokens);
  r.read("period_lr_multipliers", o.period_lr_multipliers);
  r.read("exponential_lr_min", o.exponential_lr_min);
  read_lr_stages(r, o);
}

// [[optim.sequence]]: each entry one schedule of "sequential", named by its `schedule` (no
// default: OLMo-core's list names each scheduler), running `max` units (OLMo-core's
// schedulers_max; none for the last); optim.lr and optim.units are the sequence's.
void read_lr_sequence(TableReader& r, OptimConfig& o) {
  read_array_of_tables(r, "sequence", "schedule", "schedule (schedule = \"cosine\", \"wsd\", ...)",
                       [&o](TableReader& entry_reader) {
                         OptimConfig entry;
                         entry.lr = o.lr;
                         entry.units = o.units;
                         entry.sequence_entry = true;
                         entry_reader.read("max", entry.sequence_max);
                         read_schedule(entry_reader, entry, /*in_sequence=*/true);
                         o.sequence.push_back(std::move(entry));
                       });
}

// [[optim.group_overrides]]: OLMo-core's OptimGroupOverride, `params` (globs) and the values the
// group trains with in place of [optim]'s (its opts: lr, weight_decay, betas as beta1 / beta2,
// eps).
void read_group_overrides(TableReader& r, OptimConfig& o) {
  read_array_of_tables(r, "group_overrides", "params",
                       "parameters (params = [\"blocks.*.routed_experts.*\"], ...)",
                       [&o](TableReader& entry_reader) {
                         OptimGroupOverride entry;
                         entry_reader.read("params", entry.params);
                         entry_reader.read("lr", entry.lr);
                         entry_reader.read("weight_decay", entry.weight_decay);
                         entry_reader.read("beta1", entry.beta1);
                         entry_reader.read("beta2", entry.beta2);
                         entry_reader.read("eps", entry.eps);
                         o.group_overrides.push_back(std::move(entry));
                       });
}

// [[train.downstream_tasks]]: an oe-eval request directory (`path`), the name its metrics carry
// (`label`), olmo_eval's metric type (`metric`) and its fast multiple choice (`fast_mc`); all but
// the first optional.
void read_downstream_tasks(TableReader& r, TrainConfig& t) {
  read_array_of_tables(r, "downstream_tasks", "path",
                       "task directory (path = \".../oe_eval_tasks/arc_easy/val_rc_5shot\")",
                       [&t](TableReader& entry_reader) {
                         data::IclTaskSpec entry;
                         entry_reader.read("path", entry.path);
                         entry_reader.read("label", entry.label);
                         entry_reader.read("metric", entry.metric);
                         entry_reader.read("fast_mc", entry.fast_mc);
                         t.downstream_tasks.push_back(std::move(entry));
                       });
}

// [[data.lm_eval]]: a labelled validation set of OLMo-core's LM evaluator, its `label`, token
// files (`paths`) and label masks (`label_mask`, optional).
void read_lm_eval_sets(TableReader& r, DataConfig& d) {
  read_array_of_tables(r, "lm_eval", nullptr, "", [&d](TableReader& entry_reader) {
    data::LmEvalSet entry;
    entry_reader.read("label", entry.label);
    entry_reader.read("paths", entry.paths);
    entry_reader.read("label_mask", entry.label_mask);
    d.lm_eval.push_back(std::move(entry));
  });
}

void read_optim(TableReader& r, OptimConfig& o) {
  r.read("lr", o.lr);
  r.read("beta1", o.beta1);
  r.read("beta2", o.beta2);
  r.read("eps", o.eps);
  r.read("weight_decay", o.weight_decay);
  r.read_enum("no_decay", o.no_decay,
              {{"norms_and_embeddings", NoDecay::kNormsAndEmbeddings},
               {"embeddings", NoDecay::kEmbeddings},
               {"none", NoDecay::kNone}});
  r.read("max_grad_norm", o.max_grad_norm);
  r.read("reset_optimizer_moments_on_load", o.reset_optimizer_moments_on_load);
  r.read_enum("units", o.units, {{"steps", LrUnits::kSteps}, {"tokens", LrUnits::kTokens}});
  read_schedule(r, o, /*in_sequence=*/false);
  // A sequence's schedules hold their own keys: one given to [optim] would be ignored.
  for (const char* key : kScheduleKeys)
    MOE_CHECK(o.schedule != LrSchedule::kSequential || !r.has(key),
              "[config] {}: optim.{} belongs to one schedule of optim.schedule = \"sequential\": "
              "give it in that schedule's [[optim.sequence]] entry",
              r.source(), key);
  read_lr_sequence(r, o);
  read_group_overrides(r, o);
}

void read_train(TableReader& r, TrainConfig& t) {
  r.read("seed", t.seed);
  r.read("init_seed", t.init_seed);
  r.read_enum("init_method", t.init.method,
              {{"moecore", InitMethod::kMoecore},
               {"normal", InitMethod::kNormal},
               {"llama", InitMethod::kLlama},
               {"llama_depth", InitMethod::kLlamaDepth},
               {"fan_in", InitMethod::kFanIn}});
  r.read("init_std", t.init.std);
  r.read("embedding_init_std", t.init.embedding_std);
  r.read("max_steps", t.max_steps);
  r.read("max_tokens", t.max_tokens);
  r.read("max_epochs", t.max_epochs);
  r.read("hard_stop_steps", t.hard_stop_steps);
  r.read("hard_stop_tokens", t.hard_stop_tokens);
  r.read("hard_stop_epochs", t.hard_stop_epochs);
  read_downstream_tasks(r, t);
  r.read("merge_steps", t.merge_steps);
  r.read("merge_interval", t.merge_interval);
  r.read("merge_last_n_steps", t.merge_last_n_steps);
  r.read("batch_size", t.batch_size);
  r.read("microbatches", t.microbatches);
  r.read("batch_sizes", t.batch_sizes);
  r.read("batch_size_starts", t.batch_size_starts);
  r.read_enum("batch_size_units", t.batch_size_units,
              {{"steps", BatchSizeUnits::kSteps},
               {"tokens", BatchSizeUnits::kTokens},
               {"epochs", BatchSizeUnits::kEpochs}});
  r.read("seq_len", t.seq_len);
  r.read("seq_len_warmup_steps", t.seq_len_warmup_steps);
  r.read("seq_len_warmup_min", t.seq_len_warmup_min);
  r.read("seq_len_warmup_truncate", t.seq_len_warmup_truncate);
  r.read("seq_len_warmup_multiple", t.seq_len_warmup_multiple);
  r.read("threads", t.threads);
  r.read_enum("device", t.device, {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}});
  r.read_enum("precision", t.precision,
              {{"fp32", TrainPrecision::kFp32},
               {"bf16", TrainPrecision::kBf16},
               {"mxfp8", TrainPrecision::kMxfp8}});
  r.read("mxfp8_expert_wgrad", t.mxfp8.expert_wgrad);
  r.read("mxfp8_dense", t.mxfp8.dense);
  r.read_enum("mxfp8_scale", t.mxfp8.scale_mode,
              {{"rceil", mx::ScaleMode::kRceil}, {"floor", mx::ScaleMode::kFloor}});
  r.read_enum("recompute", t.recompute,
              {{"none", ActivationRecompute::kNone},
               {"full", ActivationRecompute::kFull},
               {"moe", ActivationRecompute::kMoe},
               {"attention", ActivationRecompute::kAttention}});
  r.read("lm_head_chunk_tokens", t.lm_head_chunk_tokens);
  r.read("z_loss_multiplier", t.z_loss_multiplier);
  r.read("log_every", t.log_every);
  r.read("eval_every", t.eval_every);
  r.read("downstream_eval_every", t.downstream_eval_every);
  r.read("lm_eval_every", t.lm_eval_every);
  r.read("eval_batches", t.eval_batches);
  r.read("lm_eval_batches", t.lm_eval_batches);
  r.read("save_every", t.save_every);
  r.read("checkpoint", t.checkpoint);
  r.read("keep_last", t.keep_last);
  r.read("max_seconds", t.max_seconds);
  r.read("skip_sigma", t.skip_sigma);
  r.read("skip_window", t.skip_window);
  r.read("skip_min_window", t.skip_min_window);
  r.read_enum("skip_rule", t.skip_rule,
              {{"moecore", SkipRule::kMoecore}, {"olmo-core", SkipRule::kOlmoCore}});
  r.read("skip_max_consecutive", t.skip_max_consecutive);
  r.read("gerrymander_window", t.gerrymander_window);
  r.read("gerrymander_threshold", t.gerrymander_threshold);
  r.read("stability_monitor", t.stability_monitor);
  r.read("spike_window", t.spike_window);
  r.read("spike_rolling_window", t.spike_rolling_window);
  r.read("spike_threshold_std", t.spike_threshold_std);
  r.read("sample_prompt", t.sample_prompt);
  r.read("sample_tokens", t.sample_tokens);
  r.read("profile", t.profile);
  r.read("cuda_graph", t.cuda_graph);
  r.read_enum(
      "cuda_grouped_gemm", t.cuda_grouped_gemm,
      {{"per_expert", CudaGroupedGemm::kPerExpert}, {"one_launch", CudaGroupedGemm::kOneLaunch}});
  r.read("out_dir", t.out_dir);
}

void read_parallel(TableReader& r, ParallelConfig& p) {
  r.read("pp", p.pp);
  r.read_enum("schedule", p.schedule,
              {{"1f1b", PipelineSchedule::kOneFOneB},
               {"interleaved-1f1b", PipelineSchedule::kInterleaved},
               {"gpipe", PipelineSchedule::kGPipe}});
  r.read("virtual_stages", p.virtual_stages);
  r.read("stage_layers", p.stage_layers);
  r.read("ep", p.ep);
  r.read("zero", p.zero);
  r.read_enum("dispatch", p.dispatch, {{"sync", Dispatch::kSync}, {"rowwise", Dispatch::kRowwise}});
  r.read("capacity_factor", p.capacity_factor);
  r.read_enum("rowwise_transport", p.rowwise_transport,
              {{"auto", RowwiseTransport::kAuto},
               {"window", RowwiseTransport::kWindow},
               {"padded", RowwiseTransport::kPadded},
               {"symmetric", RowwiseTransport::kSymmetric}});
  r.read("overlap_grad_reduce", p.overlap_grad_reduce);
  r.read_enum("communicator", p.communicator,
              {{"auto", CommunicatorKind::kAuto},
               {"mpi", CommunicatorKind::kMpi},
               {"nccl", CommunicatorKind::kNccl}});
}

void read_data(TableReader& r, DataConfig& d) {
  r.read("train", d.train);
  r.read("val", d.val);
  r.read("label_mask", d.label_mask);
  r.read("val_label_mask", d.val_label_mask);
  read_lm_eval_sets(r, d);
  r.read("tokenizer", d.tokenizer);
  r.read("dtype", d.dtype);
  r.read("document_masking", d.document_masking);
  r.read("eos_id", d.eos_id);
  r.read("bos_id", d.bos_id);
  r.read("max_target_seq_len", d.max_target_seq_len);
  r.read("instance_filter", d.instance_filter);
  r.read("repetition_max_period", d.repetition.max_period);
  r.read("repetition_min_period", d.repetition.min_period);
  r.read("repetition_max_count", d.repetition.max_count);
  r.read_enum("order", d.order,
              {{"moecore", data::OrderRule::kMoecore}, {"olmo-core", data::OrderRule::kOlmoCore}});
}

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return std::string();
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// "section.key=value": the value is parsed as a TOML value. A bare word (bf16, a path, a prompt)
// is taken as a string, since shells make quoting TOML strings awkward; but a value that starts
// or holds TOML's quotes or brackets is TOML or an error (`"a" "b"` or `[1` would otherwise
// become strings unnoticed), and so is one that is not printable UTF-8 (the saved config.toml
// could not be read back).
// Returns the key it set, "section.key".
std::string apply_override(toml::table& doc, const std::string& override_text) {
  const size_t eq = override_text.find('=');
  const size_t dot = override_text.find('.');
  MOE_CHECK(eq != std::string::npos && dot != std::string::npos && dot < eq,
            "[config] override '{}' is not of the form section.key=value", override_text);
  const std::string section = trimmed(override_text.substr(0, dot));
  const std::string key = trimmed(override_text.substr(dot + 1, eq - dot - 1));
  const std::string value = trimmed(override_text.substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    const bool bare_word =
        value.find_first_of("\"'[]{}") == std::string::npos && escape_for_message(value) == value;
    MOE_CHECK(bare_word,
              "[config] --set {}.{}: {} is not a TOML value ({}); quote a string as "
              "{}.{}='\"text\"'",
              section, key, escape_for_message(value), e.description(), section, key);
    parsed = toml::table{{"v", value}};
  }
  if (!doc.contains(section)) doc.insert(section, toml::table{});
  toml::table* table = doc[section].as_table();
  MOE_CHECK(table != nullptr, "[config] override '{}': {} is not a table", override_text, section);
  table->insert_or_assign(key, *parsed.get("v"));
  return section + "." + key;
}

// The run's length is one of [train]'s max_steps, max_tokens and max_epochs. A --set of one
// (max_steps at any value, the others at a non-zero one) replaces the config file's length, so
// that `--set train.max_tokens=N` works on a config that gives max_steps; two set by --set are
// refused, as two in the file are (parse_run_config).
void apply_length_override(toml::table& doc, const std::string& key, std::string& set_before) {
  constexpr std::array<const char*, 3> kLengths = {"max_steps", "max_tokens", "max_epochs"};
  const auto length = std::find_if(kLengths.begin(), kLengths.end(), [&](const char* name) {
    return key == std::string("train.") + name;
  });
  if (length == kLengths.end()) return;
  toml::table* train = doc["train"].as_table();
  const std::string name = *length;
  const auto value = train->get(name)->value<int64_t>();
  if (name != "max_steps" && value.has_value() && *value == 0) return;  // unset only
  MOE_CHECK(set_before.empty() || set_before == key,
            "[config] --set {} and --set {}: the run's length is one of train.max_steps, "
            "train.max_tokens and train.max_epochs",
            set_before, key);
  set_before = key;
  for (const char* other : kLengths)
    if (name != other) train->erase(other);
}

// OLMo-core's WSDS refuses periods that do not hold their decay (and the first its warm-up), and
// asserts, once there, that each decay falls; a decay of no units divides by zero at its period's
// end. Its lengths are its own, so everything is checked without the run's: a schedule that
// breaks in a period this run stops short of is refused too (OLMo-core would train until there),
// as the run may be resumed with a larger train.max_steps.
void validate_wsds(const OptimConfig& o) {
  const bool in_tokens = o.units == LrUnits::kTokens;
  const char* key = in_tokens ? "period_tokens" : "period_steps";
  const char* units = in_tokens ? "tokens" : "updates";
  MOE_CHECK((in_tokens ? o.period_steps : o.period_tokens).empty(),
            "[config] optim.units = \"{}\" gives the periods of \"wsds\" in {}: set optim.{}, not "
            "optim.{}",
            in_tokens ? "tokens" : "steps", units, key,
            in_tokens ? "period_steps" : "period_tokens");
  const std::vector<int64_t>& periods = period_lengths(o);
  MOE_CHECK(!periods.empty(),
            "[config] optim.schedule = \"wsds\" needs its periods: optim.{} = [length, ...] in {}",
            key, units);
  MOE_CHECK(o.period_lr_multipliers.empty() || o.period_lr_multipliers.size() == periods.size(),
            "[config] optim.period_lr_multipliers has {} values for {} periods (optim.{}): give "
            "one per period, or none",
            o.period_lr_multipliers.size(), periods.size(), key);
  int64_t total = 0;
  const int64_t warmup = warmup_length(o, periods.front());  // a fraction of the first period
  for (size_t i = 0; i < periods.size(); ++i) {
    const int64_t length = periods[i];
    MOE_CHECK(length > 0, "[config] optim.{}[{}]={} must be positive", key, i, length);
    MOE_CHECK(length <= std::numeric_limits<int64_t>::max() - total,
              "[config] optim.{}: the periods' total overflows a 64-bit count", key);
    total += length;
    const int64_t decay = decay_length(o, length);
    // A decay of 0 units divides by zero at its period's end, which the next period's start
    // reaches; after the last period the floor holds without it.
    const bool last = i + 1 == periods.size();
    MOE_CHECK(decay >= 1 || last || o.sequence_entry,
              "[config] optim.schedule = \"wsds\": optim.{}[{}]={} decays over round({} x "
              "optim.decay_fraction={}) = 0 {} (OLMo-core divides by zero at the end of a period "
              "before the last): set optim.{} or a larger optim.decay_fraction",
              key, i, length, length, o.decay_fraction, units,
              in_tokens ? "decay_tokens" : "decay_steps");
    const int64_t first_warmup = i == 0 ? warmup : 0;
    MOE_CHECK(decay <= length && first_warmup <= length - decay,
              "[config] optim.schedule = \"wsds\": optim.{}[{}]={} {} is shorter than its {}decay "
              "({}{} {})",
              key, i, length, units, i == 0 ? "warm-up and " : "",
              i == 0 ? fmt::format("{} + ", warmup) : "", decay, units);
    const double multiplier = o.period_lr_multipliers.empty() ? 1.0 : o.period_lr_multipliers[i];
    MOE_CHECK(multiplier > 0.0, "[config] optim.period_lr_multipliers[{}]={} must be positive", i,
              multiplier);
    MOE_CHECK(decay == 0 || o.sequence_entry || o.lr * o.min_lr_ratio < o.lr * multiplier,
              "[config] optim.schedule = \"wsds\": optim.{}[{}] decays from lr x {} to lr x "
              "optim.min_lr_ratio={}, not below it (OLMo-core asserts)",
              key, i, multiplier, o.min_lr_ratio);
  }
}

// A rate of a composable stage or an override decay: >= 0 where given.
void check_rate(const std::string& where, const char* key, const std::optional<double>& value) {
  MOE_CHECK(!value || *value >= 0.0, "[config] {}.{}={} must be >= 0", where, key,
            value.value_or(0.0));
}

// OLMo-core's ComposableSchedulerStage checks: positive durations, rates >= 0, at most one start
// and exactly one end per stage; positions that fit a 64-bit count.
void validate_composable(const OptimConfig& o) {
  MOE_CHECK(!o.stages.empty(),
            "[config] optim.schedule = \"composable\" needs its stages: [[optim.stages]] tables "
            "with duration and end_lr or end_lr_fraction");
  int64_t total = 0;
  for (size_t i = 0; i < o.stages.size(); ++i) {
    const LrStage& stage = o.stages[i];
    const std::string where = fmt::format("optim.stages[{}]", i);
    MOE_CHECK(stage.duration > 0, "[config] {}.duration={} must be > 0", where, stage.duration);
    MOE_CHECK(stage.duration <= std::numeric_limits<int64_t>::max() - total,
              "[config] optim.stages: the durations' total overflows a 64-bit count");
    total += stage.duration;
    MOE_CHECK(!(stage.start_lr && stage.start_lr_fraction),
              "[config] {}: give at most one of start_lr and start_lr_fraction", where);
    MOE_CHECK(stage.end_lr.has_value() != stage.end_lr_fraction.has_value(),
              "[config] {}: give exactly one of end_lr and end_lr_fraction", where);
    check_rate(where, "start_lr", stage.start_lr);
    check_rate(where, "start_lr_fraction", stage.start_lr_fraction);
    check_rate(where, "end_lr", stage.end_lr);
    check_rate(where, "end_lr_fraction", stage.end_lr_fraction);
  }
}

// OLMo-core's OverrideDecay checks (composable's and sequential's).
void validate_override_decay(const OptimConfig& o) {
  if (!o.override_decay) return;
  const LrOverrideDecay& d = *o.override_decay;
  const std::string where = "optim.override_decay";
  MOE_CHECK(d.start >= 0, "[config] {}.start={} must be >= 0", where, d.start);
  MOE_CHECK(d.duration > 0, "[config] {}.duration={} must be > 0", where, d.duration);
  MOE_CHECK(d.duration <= std::numeric_limits<int64_t>::max() - d.start,
            "[config] {}: start + duration overflows a 64-bit count", where);
  MOE_CHECK(d.end_lr.has_value() != d.end_lr_fraction.has_value(),
            "[config] {}: give exactly one of end_lr and end_lr_fraction", where);
  check_rate(where, "end_lr", d.end_lr);
  check_rate(where, "end_lr_fraction", d.end_lr_fraction);
}

// A check of an [[optim.sequence]] entry (OptimConfig's, on the entry) names the entry's keys:
// its error's "optim.KEY" becomes "optim.sequence[i].KEY" (lr and units stay the sequence's).
template <typename Check>
void check_sequence_entry(size_t i, Check check) {
  try {
    check();
  } catch (const Error& e) {
    const std::string message = e.what();
    const std::string entry = fmt::format("optim.sequence[{}].", i);
    std::string out;
    for (size_t at = 0;;) {
      const size_t found = message.find("optim.", at);
      if (found == std::string::npos) {
        out += message.substr(at);
        break;
      }
      const size_t key = found + 6;
      size_t key_end = key;
      while (
          key_end < message.size() &&
          (std::isalnum(static_cast<unsigned char>(message[key_end])) || message[key_end] == '_'))
        ++key_end;
      const std::string name = message.substr(key, key_end - key);
      out += message.substr(at, found - at);
      out += name == "lr" || name == "units" || name == "sequence" ? "optim." : entry;
      at = key;
    }
    throw Error(out);
  }
}

// OLMo-core's SequentialScheduler's checks (a max for each scheduler but the last, which runs to
// the end), and each entry's own; positions that fit a 64-bit count.
void validate_sequence(const OptimConfig& o) {
  MOE_CHECK(!o.sequence.empty(),
            "[config] optim.schedule = \"sequential\" needs its schedules: [[optim.sequence]] "
            "tables, each with schedule and, but for the last, max");
  const char* units = o.units == LrUnits::kTokens ? "tokens" : "updates";
  int64_t total = 0;
  for (size_t i = 0; i < o.sequence.size(); ++i) {
    const OptimConfig& entry = o.sequence[i];
    MOE_CHECK(entry.schedule != LrSchedule::kSequential && entry.sequence.empty(),
              "[config] optim.sequence[{}]: a schedule of a sequence cannot be \"sequential\"", i);
    MOE_CHECK(entry.lr == o.lr && entry.units == o.units,
              "[config] optim.sequence[{}] must have the sequence's optim.lr and optim.units", i);
    if (i + 1 == o.sequence.size()) {
      MOE_CHECK(entry.sequence_max == 0,
                "[config] optim.sequence[{}].max={}: the last schedule runs to the run's end "
                "(OLMo-core ignores its max): leave it out",
                i, entry.sequence_max);
    } else {
      MOE_CHECK(entry.sequence_max >= 1,
                "[config] optim.sequence[{}].max={} must be >= 1: each schedule but the last "
                "runs that many {} (OLMo-core's schedulers_max)",
                i, entry.sequence_max, units);
      MOE_CHECK(entry.sequence_max <= std::numeric_limits<int64_t>::max() - total,
                "[config] optim.sequence: the schedules' max total overflows a 64-bit count");
      total += entry.sequence_max;
    }
    check_sequence_entry(i, [&] { entry.validate(); });
  }
}

// OLMo-core's SequenceLengthSchedulerCallback's settings (its pre_train's checks, and what its
// melt and truncate need to cut every instance): the micro-batches' split is checked with the
// run's layout (check_warmup_shapes).
void validate_seq_len_warmup(const RunConfig& config) {
  const TrainConfig& t = config.train;
  MOE_CHECK(t.seq_len_warmup_steps >= 0,
            "[config] train.seq_len_warmup_steps={} must be >= 0 (0: no warm-up)",
            t.seq_len_warmup_steps);
  if (t.seq_len_warmup_steps == 0) return;
  MOE_CHECK(t.seq_len_warmup_min >= 1 && t.seq_len_warmup_min < t.seq_len,
            "[config] train.seq_len_warmup_min={} must be in [1, train.seq_len={}): the warm-up "
            "rises from it to train.seq_len",
            t.seq_len_warmup_min, t.seq_len);
  const int64_t ratio = t.seq_len / t.seq_len_warmup_min;
  MOE_CHECK(t.seq_len_warmup_truncate ||
                (t.seq_len % t.seq_len_warmup_min == 0 && (ratio & (ratio - 1)) == 0),
            "[config] train.seq_len={} must be train.seq_len_warmup_min={} x a power of 2: the "
            "warm-up melts each instance into power-of-2 pieces (or set "
            "train.seq_len_warmup_truncate = true)",
            t.seq_len, t.seq_len_warmup_min);
  MOE_CHECK(!t.seq_len_warmup_truncate || t.seq_len_warmup_multiple >= 1,
            "[config] train.seq_len_warmup_multiple={} must be >= 1: the truncated length is a "
            "multiple of it",
            t.seq_len_warmup_multiple);
  // (seq_len - min) x step, exact in 64 bits as in Python's integers.
  MOE_CHECK(t.seq_len_warmup_steps <= (int64_t{1} << 30),
            "[config] train.seq_len_warmup_steps={} must be at most 2^30", t.seq_len_warmup_steps);
  MOE_CHECK(!config.data.document_masking,
            "[config] train.seq_len_warmup_steps with data.document_masking: OLMo-core's "
            "sequence-length warm-up cannot cut its document lengths");
  MOE_CHECK(!t.cuda_graph,
            "[config] train.cuda_graph=true cannot replay the steps of a sequence-length warm-up "
            "(their shapes change)");
}

// OLMo-core's InstanceFilterConfig: its find_periodic_sequences takes periods from 1 (a period of
// 0 divides by zero there); a count of 3 or less masks every repetition it reports (it reports
// those of more than two periods). Its keys without the filter would be ignored.
void validate_instance_filter(const DataConfig& d) {
  const data::RepetitionFilter& r = d.repetition;
  constexpr int64_t kMost = int64_t{1} << 31;
  MOE_CHECK(r.min_period >= 1 && r.min_period <= kMost,
            "[config] data.repetition_min_period={} is outside [1, 2^31]", r.min_period);
  MOE_CHECK(r.max_period >= r.min_period && r.max_period <= kMost,
            "[config] data.repetition_max_period={} is outside [data.repetition_min_period={}, "
            "2^31]",
            r.max_period, r.min_period);
  MOE_CHECK(r.max_count >= 1 && r.max_count <= kMost,
            "[config] data.repetition_max_count={} is outside [1, 2^31]", r.max_count);
  MOE_CHECK(d.instance_filter || r == data::RepetitionFilter{},
            "[config] data.repetition_max_period, repetition_min_period and repetition_max_count "
            "set the instance filter, which data.instance_filter = false leaves off");
}

// OLMo-core's BatchSizeSchedulerCallback's checks (its __post_init__ and post_attach), and what
// moecore's loop needs of each batch: whole micro-batches of the run's size, a step a graph can
// replay. Every two sizes are integer multiples of each other, not only neighbours (OLMo-core's
// rule): a start reached while an increase waits for its loader skips the size before it, and its
// callback then asserts on a ratio its checks never saw.
void validate_batch_size_schedule(const RunConfig& config) {
  const TrainConfig& t = config.train;
  const std::vector<int64_t>& sizes = t.batch_sizes;
  const std::vector<int64_t>& starts = t.batch_size_starts;
  MOE_CHECK(sizes.size() == starts.size(),
            "[config] train.batch_sizes has {} entries and train.batch_size_starts {}: one start "
            "for each batch size",
            sizes.size(), starts.size());
  if (sizes.empty()) return;
  MOE_CHECK(starts.front() == 0,
            "[config] train.batch_size_starts[0]={}: the batch size schedule starts at 0",
            starts.front());
  MOE_CHECK(sizes.front() == t.batch_size,
            "[config] train.batch_sizes[0]={} must be train.batch_size={}: the schedule starts "
            "from the run's batch size, the one optim.lr is for",
            sizes.front(), t.batch_size);
  const int64_t rows = t.batch_size / t.microbatches;
  for (size_t i = 0; i < sizes.size(); ++i) {
    MOE_CHECK(sizes[i] > 0 && sizes[i] <= (int64_t{1} << 32) / t.seq_len,
              "[config] train.batch_sizes[{}]={} must be in [1, {}] (2^32 tokens a step of "
              "train.seq_len={})",
              i, sizes[i], (int64_t{1} << 32) / t.seq_len, t.seq_len);
    MOE_CHECK(sizes[i] % rows == 0,
              "[config] train.batch_sizes[{}]={} is not a whole number of micro-batches of {} "
              "sequences (train.batch_size / train.microbatches, which the schedule keeps)",
              i, sizes[i], rows);
    if (i == 0) continue;
    MOE_CHECK(starts[i] > starts[i - 1],
              "[config] train.batch_size_starts[{}]={} must come after train.batch_size_starts[{}]="
              "{}",
              i, starts[i], i - 1, starts[i - 1]);
    MOE_CHECK(sizes[i] != sizes[i - 1],
              "[config] train.batch_sizes[{}] and [{}] are both {}: a schedule's neighbours differ",
              i - 1, i, sizes[i]);
    for (size_t j = 0; j < i; ++j) {
      const int64_t small = std::min(sizes[i], sizes[j]), large = std::max(sizes[i], sizes[j]);
      MOE_CHECK(large % small == 0,
                "[config] train.batch_sizes[{}]={} and [{}]={}: every two batch sizes of the "
                "schedule must be integer multiples of each other (the data position and the "
                "learning rate move by whole factors, as OLMo-core's)",
                j, sizes[j], i, sizes[i]);
    }
  }
  MOE_CHECK(!t.cuda_graph,
            "[config] train.cuda_graph=true cannot replay a step whose micro-batches change "
            "(train.batch_sizes)");
  // A length in updates may run all of them at the largest batch: its tokens must fit a 64-bit
  // count (a length in tokens or epochs bounds them itself).
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  MOE_CHECK(t.max_tokens > 0 || t.max_epochs > 0 ||
                t.max_steps <= std::numeric_limits<int64_t>::max() / (largest * t.seq_len),
            "[config] train.max_steps={} updates of up to {} x {} tokens (train.batch_sizes) "
            "overflow a 64-bit token count",
            t.max_steps, largest, t.seq_len);
  // OLMo-core's post_attach: a schedule in updates whose horizon is the run's updates would move
  // with every change of the batch when the run's length is tokens or epochs. It lets WSD's move
  // (as here: its decay then ends on the run's last update) and its ConstantScheduler, which
  // moecore's "constant" (its ConstantWithWarmup) is not.
  const OptimConfig& o = config.optim;
  const bool own_t_max = has_t_max(o.schedule) && t_max_length(o) > 0;
  MOE_CHECK(o.units == LrUnits::kTokens || (t.max_tokens == 0 && t.max_epochs == 0) ||
                o.schedule == LrSchedule::kWsd || own_t_max,
            "[config] train.batch_sizes with the run's length in {} needs optim.units = "
            "\"tokens\" (or optim.t_max_steps, or optim.schedule = \"wsd\"): a schedule in "
            "updates over the run's updates would move with each batch size, which OLMo-core's "
            "BatchSizeSchedulerCallback refuses",
            t.max_tokens > 0 ? "tokens" : "epochs");
}

}  // namespace

int64_t max_steps_for_tokens(const TrainConfig& t, TokenOrigin origin) {
  if (t.max_tokens == 0) return t.max_steps;
  // batch_size x seq_len: below 2^33 (parse_run_config's bounds).
  return step_reaching_tokens(t.max_tokens, t.batch_size * t.seq_len, origin);
}

int64_t last_step(const TrainConfig& t, TokenOrigin origin) {
  if (t.hard_stop_steps > 0) return std::min(t.max_steps, t.hard_stop_steps);
  if (t.hard_stop_tokens > 0)
    return std::min(t.max_steps,
                    step_reaching_tokens(t.hard_stop_tokens, t.batch_size * t.seq_len, origin));
  return t.max_steps;
}

int64_t step_reaching_tokens(int64_t tokens, int64_t per_step, TokenOrigin origin) {
  const int64_t left = std::max<int64_t>(tokens - origin.tokens, 0);
  // ceil(left / per_step) without the overflow of left + per_step - 1 near 2^63. (OLMo-core's
  // math.ceil divides in floating point: the same below 2^53 remaining tokens.)
  return origin.step + left / per_step + (left % per_step != 0 ? 1 : 0);
}

namespace {

// What validate_lr_schedule checks a schedule over: its initial_lr, its horizon (OLMo-core's
// t_max), the positions it is asked at (all in the schedule's units), and its length as errors
// name it. The positions: the run's updates', next_position + k x unit up to updates_last (the
// run's next update and its last), and in a sequence under an override decay the override's start
// (`extra`: OLMo-core asks the sequence for the rate there); `last` is the last of them all.
struct ScheduleSpan {
  double lr = 0.0;
  int64_t horizon = 0;
  int64_t last = 0;
  bool runs = false;
  int64_t next_position = 0;
  int64_t unit = 1;
  std::string length, run_length;
  int64_t updates_last = 0;
  std::optional<int64_t> extra;
  // The run's own schedule: WSDS's periods are checked whether reached or not (a resume may go on
  // into them). A sequence's schedule: those its positions reach (it is checked again at a
  // resume, over the new length).
  bool whole = true;
};

// Whether `span` asks a position in [from, to].
// The first of `span`'s updates' positions at `from` or after (past updates_last: none).
int64_t first_update_from(const ScheduleSpan& span, int64_t from) {
  const int64_t p = span.next_position;
  return p >= from ? p : p + (from - p + span.unit - 1) / span.unit * span.unit;
}

bool asks_within(const ScheduleSpan& span, int64_t from, int64_t to) {
  if (span.extra && *span.extra >= from && *span.extra <= to) return true;
  return first_update_from(span, from) <= std::min(to, span.updates_last);
}

// The part of `span` (the sequence's) that its schedule over (lo, hi] is asked at, counted from
// lo: the updates' positions before an override decay's start, and that start itself once the
// run reaches it (for the first schedule, at lo = 0 too). `any`: whether it is asked at all.
struct AskedPositions {
  bool any = false;
  int64_t first = 0, updates_last = 0, last = 0;
  std::optional<int64_t> extra;
};
AskedPositions asked_positions(const ScheduleSpan& span, const std::optional<LrOverrideDecay>& o,
                               int64_t lo, int64_t hi, bool first_schedule) {
  AskedPositions out;
  const int64_t end = o ? std::min(span.last, o->start - 1) : span.last;  // updates' positions
  const int64_t bound = std::min(end, hi);
  const int64_t p = first_update_from(span, lo + 1);
  if (p <= bound) {
    out.any = true;
    out.first = p - lo;
    out.updates_last = p + (bound - p) / span.unit * span.unit - lo;
    out.last = out.updates_last;
  } else {
    out.updates_last = -1;  // none
  }
  // The first schedule is asked at 0 too (an override decay from 0: OLMo-core's current <= max).
  if (o && span.last >= o->start && (o->start > lo || (first_schedule && o->start == lo)) &&
      o->start <= hi) {
    out.extra = o->start - lo;
    out.first = out.any ? std::min(out.first, *out.extra) : *out.extra;
    out.last = std::max(out.updates_last, *out.extra);
    out.any = true;
  }
  return out;
}

// The checks of one schedule over `span` (a sequence's entries each over its own). OLMo-core's
// WSD, CosWithWarmupAndLinearDecay and PowerLR divide by their decay's length (a
// ZeroDivisionError at the last step there). OLMo-core's InvSqrtWithWarmup without a warm-up is
// lr x min_lr_ratio from the first update (sqrt(0 / t)): a run at its floor is refused rather
// than trained; its PowerLR divides by the warm-up.
void check_schedule_over(const OptimConfig& optim, const ScheduleSpan& span) {
  const LrSchedule schedule = optim.schedule;
  const bool in_tokens = optim.units == LrUnits::kTokens;
  const double lr = span.lr;
  const int64_t horizon = span.horizon, last = span.last;
  const std::string &length = span.length, &run_length = span.run_length;
  const char* warmup_keys = in_tokens ? "optim.warmup_tokens or optim.warmup_fraction"
                                      : "optim.warmup_steps or optim.warmup_fraction";
  MOE_CHECK(schedule != LrSchedule::kInvSqrt || !span.runs || warmup_length(optim, horizon) >= 1,
            "[config] optim.schedule = \"inv_sqrt\" needs a warm-up (it scales by sqrt(warm-up "
            "/ t); without one the rate is lr x min_lr_ratio throughout): set {}",
            warmup_keys);
  MOE_CHECK(schedule != LrSchedule::kPower || !span.runs || warmup_length(optim, horizon) >= 1,
            "[config] optim.schedule = \"power\" needs a warm-up (its law is lr (t / warm-up)^b): "
            "set {}",
            warmup_keys);
  const char* schedule_name = schedule == LrSchedule::kWsd                 ? "wsd"
                              : schedule == LrSchedule::kCosineLinearDecay ? "cosine_linear_decay"
                                                                           : "power";
  // WSD and PowerLR warm up through update `warmup` before they look at their tail: a run that
  // the warm-up covers never reaches it, and OLMo-core trains it (a short trial of a long run's
  // schedule). CosWithWarmupAndLinearDecay asks for its tail first, at every update. A tail that
  // starts after the last position asked is never reached either: the run's last update reaches
  // its own schedule's tail, but a sequence may leave a schedule before its tail.
  const bool tail_unreached =
      ((schedule == LrSchedule::kWsd || schedule == LrSchedule::kPower) &&
       warmup_length(optim, horizon) >= last) ||
      (has_decay_tail(schedule) && last < horizon - decay_length(optim, horizon));
  MOE_CHECK(!has_decay_tail(schedule) || !span.runs || tail_unreached ||
                decay_length(optim, horizon) >= 1,
            "[config] optim.schedule = \"{}\" decays over round({} x optim.decay_fraction={}) = 0 "
            "{}: set optim.{} or a larger optim.decay_fraction",
            schedule_name, length, optim.decay_fraction, in_tokens ? "tokens" : "updates",
            in_tokens ? "decay_tokens" : "decay_steps");
  // Their tails start from the rate at the tail's start, which must be inside the run (OLMo-core's
  // power law is infinite at 0, its cosine's warm-up negative before it), and fall: OLMo-core
  // asserts decay_min_lr < that rate.
  if ((schedule == LrSchedule::kCosineLinearDecay || schedule == LrSchedule::kPower) && span.runs &&
      !tail_unreached) {
    const int64_t decay = decay_length(optim, horizon);
    // The tail of a cosine may start at its position 0 or before: from lr there without a
    // warm-up (before 0 OLMo-core's warm-up of 0 divides by zero), else from its warm-up line
    // (warmup_min_lr at 0, below it before; the rate check below decides). PowerLR's law is
    // infinite at 0.
    const int64_t cosine_warmup = warmup_length(optim, own_horizon(optim, horizon));
    const bool early_tail =
        schedule == LrSchedule::kCosineLinearDecay && (decay == horizon || cosine_warmup > 0);
    MOE_CHECK(decay < horizon || early_tail,
              "[config] optim.schedule = \"{}\" decays over {} of {}: the decay tail must start "
              "after the run does (a smaller optim.{} or optim.decay_fraction)",
              schedule_name, decay, run_length, in_tokens ? "decay_tokens" : "decay_steps");
    // OLMo-core's tail asks its cosine at the tail's start: inside the warm-up, the warm-up
    // asserts that it rises.
    MOE_CHECK(schedule != LrSchedule::kCosineLinearDecay || horizon - decay >= cosine_warmup ||
                  optim.warmup_min_lr < lr,
              "[config] optim.schedule = \"cosine_linear_decay\" over {}: its tail starts inside "
              "its warm-up, whose optim.warmup_min_lr={} is not below the rate it rises to ({}): "
              "OLMo-core asserts that a warm-up rises",
              run_length, optim.warmup_min_lr, lr);
    const double start = decay_tail_start(optim, horizon, lr);
    const double end = optim.lr * optim.decay_min_lr_ratio;
    MOE_CHECK(end < start,
              "[config] optim.schedule = \"{}\" over {}: its decay tail would go from {} up to "
              "lr x optim.decay_min_lr_ratio = {}; it must end below where it starts",
              schedule_name, run_length, start, end);
  }
  // OLMo-core's warm-ups assert that they rise: warmup_min_lr below the rate they rise to (lr;
  // half_cos: half way down its cosine; wsds: its first period's peak), once one runs: where an
  // update from `origin` on is still in the warm-up (after a batch-size change, initial_lr moved;
  // in a sequence it is where the schedule before ended, which may be 0).
  const int64_t next_position = span.next_position;
  if (span.runs) {
    const bool wsds = schedule == LrSchedule::kWsds;
    const int64_t warmup =
        warmup_length(optim, wsds ? period_lengths(optim).front() : own_horizon(optim, horizon));
    const double lr_min = lr * optim.min_lr_ratio;
    const double peak = schedule == LrSchedule::kHalfCosine ? lr_min + (lr - lr_min) / 2.0
                        : wsds && !optim.period_lr_multipliers.empty()
                            ? lr * optim.period_lr_multipliers[0]
                            : lr;
    // WSD, ConstantWithWarmup and PowerLR warm up through position `warmup`, the others below.
    const bool through = schedule == LrSchedule::kWsd || schedule == LrSchedule::kConstant ||
                         schedule == LrSchedule::kPower;
    const bool warms_up = through ? next_position <= warmup : next_position < warmup;
    MOE_CHECK(!through || warmup > 0 || next_position > 0,
              "[config] optim.schedule = \"{}\" is asked for its rate at position 0 (an "
              "override decay from 0), where OLMo-core's warm-up of 0 divides by zero",
              schedule == LrSchedule::kWsd                ? "wsd"
              : through && schedule == LrSchedule::kPower ? "power"
                                                          : "constant");
    MOE_CHECK(warmup == 0 || !warms_up || optim.warmup_min_lr < peak,
              "[config] optim.warmup_min_lr={} is not below the rate the warm-up rises to ({}): "
              "OLMo-core asserts that a warm-up rises",
              optim.warmup_min_lr, peak);
  }
  // OLMo-core's WSDS asserts each decay falls from its peak, initial_lr x the period's multiplier,
  // to its decay_min_lr (lr x min_lr_ratio; validate_wsds checks it at optim.lr): after a
  // batch-size change at initial_lr.
  // In a sequence (validate_wsds leaves it to this) where a position reaches the decay: OLMo-core's
  // decay of a period runs to its end, the last period's but for its end (the floor there), and
  // one of 0 units divides by zero at its period's end.
  if (schedule == LrSchedule::kWsds && (lr != optim.lr || !span.whole)) {
    const std::vector<int64_t>& periods = period_lengths(optim);
    const int64_t warmup = warmup_length(optim, periods.front());
    int64_t period_start = warmup;  // after the warm-up, which takes the first period's start
    for (size_t i = 0; i < periods.size(); ++i) {
      const bool last_period = i + 1 == periods.size();
      const int64_t adjusted = periods[i] - (i == 0 ? warmup : 0);
      const int64_t decay = decay_length(optim, periods[i]);
      const int64_t decay_start = period_start + adjusted - decay;
      period_start += adjusted;
      if (!span.whole &&
          !asks_within(span, decay_start, last_period ? period_start - 1 : period_start))
        continue;  // not reached
      MOE_CHECK(decay >= 1 || last_period,
                "[config] optim.schedule = \"wsds\": period {} decays over round({} x "
                "optim.decay_fraction={}) = 0 {} (OLMo-core divides by zero at its end): set "
                "optim.{} or a larger optim.decay_fraction",
                i, periods[i], optim.decay_fraction, in_tokens ? "tokens" : "updates",
                in_tokens ? "decay_tokens" : "decay_steps");
      const double multiplier =
          optim.period_lr_multipliers.empty() ? 1.0 : optim.period_lr_multipliers[i];
      MOE_CHECK(
          decay_length(optim, periods[i]) == 0 || optim.lr * optim.min_lr_ratio < lr * multiplier,
          "[config] optim.schedule = \"wsds\": period {} decays from {} x {} (its initial_lr: "
          "where train.batch_sizes scaled lr to, or a sequence's schedule before it ended) to lr "
          "x optim.min_lr_ratio={}, not below it (OLMo-core asserts)",
          i, lr, multiplier, optim.min_lr_ratio);
    }
  }
  // OLMo-core's WSD asserts its decay_min_lr (here lr x min_lr_ratio) is below lr once the decay
  // is reached (the run outlasts the warm-up).
  MOE_CHECK(schedule != LrSchedule::kWsd || !span.runs || tail_unreached ||
                optim.lr * optim.min_lr_ratio < lr,
            "[config] optim.schedule = \"wsd\" decays to lr x optim.min_lr_ratio={}, not below "
            "{}: set a ratio below 1",
            optim.min_lr_ratio,
            lr == optim.lr ? std::string("lr")
                           : fmt::format("the rate {} the batch size schedule scaled lr to", lr));
  if (schedule != LrSchedule::kSequential || !span.runs) return;
  // OLMo-core's SequentialScheduler asserts 0 <= current <= t_max before anything else: a last
  // update that ends past train.max_tokens stops its run there.
  MOE_CHECK(last <= horizon,
            "[config] optim.schedule = \"sequential\" over {}: the run's last update ends at {}, "
            "past it, where OLMo-core's SequentialScheduler asserts (current <= t_max); make "
            "train.max_tokens a multiple of the tokens of an update",
            run_length, last);
  // SequentialScheduler: each schedule over its part, min(the horizon left, its max), from the
  // rate the one before ended at (sequence_next_initial_lr), checked where the run asks it: up to
  // its last update, or an override decay's start (from there OLMo-core asks the sequence only
  // for the rate at that start).
  const char* units = in_tokens ? "tokens" : "updates";
  int64_t offset = 0;
  double entry_lr = lr;
  for (size_t i = 0; i < optim.sequence.size(); ++i) {
    const OptimConfig& entry = optim.sequence[i];
    const bool final_entry = i + 1 == optim.sequence.size();
    const int64_t end =
        final_entry ? std::numeric_limits<int64_t>::max() : offset + entry.sequence_max;
    const AskedPositions asked = asked_positions(span, optim.override_decay, offset, end, i == 0);
    ScheduleSpan part;
    part.lr = entry_lr;
    part.horizon = final_entry ? horizon - offset : std::min(horizon - offset, entry.sequence_max);
    part.runs = asked.any && part.horizon > 0;
    part.next_position = asked.first;
    part.last = asked.last;
    part.updates_last = asked.updates_last;
    part.extra = asked.extra;
    part.unit = span.unit;
    part.whole = false;
    part.length =
        fmt::format("{} {} (optim.sequence[{}]'s part of {})", part.horizon, units, i, length);
    part.run_length = part.length;
    if (part.runs) check_sequence_entry(i, [&] { check_schedule_over(entry, part); });
    // Asked past its end: the next schedules are.
    if (final_entry || !asked_positions(span, optim.override_decay, end,
                                        std::numeric_limits<int64_t>::max(), false)
                            .any)
      break;
    // Past its end, the next schedule starts from its rate at its max over a horizon of its max
    // (sequence_next_initial_lr), which OLMo-core asks too.
    ScheduleSpan at_end = part;
    at_end.horizon = entry.sequence_max;
    at_end.runs = true;
    at_end.next_position = at_end.last = entry.sequence_max;
    at_end.updates_last = -1;  // no update's position, only its end
    at_end.extra = entry.sequence_max;
    at_end.length = at_end.run_length =
        fmt::format("{} {} (optim.sequence[{}]'s end, the next schedule's start)",
                    entry.sequence_max, units, i);
    check_sequence_entry(i, [&] { check_schedule_over(entry, at_end); });
    entry_lr = sequence_next_initial_lr(entry, entry_lr);
    offset = end;
  }
}

}  // namespace

void validate_lr_schedule(const OptimConfig& optim, int64_t max_steps, int64_t tokens_per_step,
                          TokenOrigin origin, int64_t max_tokens, int64_t max_epochs,
                          double initial_lr) {
  const double lr = initial_lr > 0.0 ? initial_lr : optim.lr;  // OLMo-core's initial_lr
  // The run's length in the schedule's units: its updates, or the tokens they add.
  const bool in_tokens = optim.units == LrUnits::kTokens;
  const int64_t unit = schedule_unit(optim, tokens_per_step);
  MOE_CHECK(max_steps <= std::numeric_limits<int64_t>::max() / unit,
            "[config] train.max_steps={} x {} tokens a step overflows the token count of "
            "optim.units = \"tokens\"",
            max_steps, unit);
  // After another batch size or seq_len: the tokens seen at the origin and the remaining
  // updates' (learning_rate's horizon).
  const bool shifted = in_tokens && origin.tokens != origin.step * unit;
  // Where the last update is, in the units, and the schedule's horizon: the same, unless
  // train.max_tokens sets the horizon of a schedule in tokens (the last update may end past it,
  // where learning_rate asks as OLMo-core does).
  int64_t last = max_steps * unit;
  MOE_CHECK(
      !shifted || !__builtin_add_overflow(origin.tokens, (max_steps - origin.step) * unit, &last),
      "[config] the {} tokens seen by step {} and (train.max_steps={} - {}) x {} tokens "
      "overflow the token count of optim.units = \"tokens\"",
      origin.tokens, origin.step, max_steps, origin.step, unit);
  const bool tokens_horizon = in_tokens && max_tokens > 0;
  const int64_t horizon = tokens_horizon ? max_tokens : last;
  // Names the length in errors as the config gave it.
  const std::string given = max_tokens > 0   ? fmt::format("train.max_tokens={}", max_tokens)
                            : max_epochs > 0 ? fmt::format("train.max_epochs={}", max_epochs)
                                             : std::string();
  const std::string length =
      tokens_horizon ? fmt::format("{} tokens (train.max_tokens)", horizon)
      : !in_tokens   ? (given.empty() ? fmt::format("train.max_steps={}", max_steps)
                                      : fmt::format("train.max_steps={} (from {})", max_steps, given))
      : shifted      ? fmt::format(
                           "{} tokens (the {} seen by step {} and (train.max_steps - {}) x "
                                "batch_size x seq_len)",
                           horizon, origin.tokens, origin.step, origin.step)
      : given.empty() ? fmt::format("{} tokens (train.max_steps x batch_size x seq_len)", horizon)
                      : fmt::format("{} tokens (the {} updates of {} x batch_size x seq_len)",
                                    horizon, max_steps, given);
  const ScheduleSpan span{lr,
                          horizon,
                          last,
                          max_steps > 0,
                          in_tokens ? origin.tokens + unit : origin.step + 1,
                          unit,
                          length,
                          in_tokens ? "the run's " + length : length + " updates",
                          last,
                          std::nullopt};
  check_schedule_over(optim, span);
  // Each group override's schedule, at its own initial_lr (moved as optim.lr's by the batch-size
  // changes): a warm-up from warmup_min_lr or a tail to an absolute floor may not fall or rise
  // as OLMo-core requires at another peak.
  for (size_t k = 0; k < optim.group_overrides.size(); ++k) {
    const std::optional<double>& group_lr = optim.group_overrides[k].lr;
    if (!group_lr) continue;
    ScheduleSpan group_span = span;
    group_span.lr = *group_lr * (lr / optim.lr);
    try {
      check_schedule_over(optim, group_span);
    } catch (const Error& e) {
      fail("{} (the schedule of optim.group_overrides[{}], at its lr={})", e.what(), k,
           group_span.lr);
    }
  }
}

std::vector<int64_t> merge_steps(const TrainConfig& t, int64_t max_steps) {
  if (t.merge_interval == 0) return t.merge_steps;
  std::vector<int64_t> steps;
  for (int64_t step = t.merge_interval; step <= max_steps; step += t.merge_interval)
    steps.push_back(step);
  return steps;
}

void OptimConfig::validate() const {
  // Every float finite (a config file is checked on reading already; this also covers configs
  // built in code): lr = inf trained to all-NaN weights and exited 0.
  for (const auto& [key, value] : {std::pair{"lr", lr},
                                   {"beta1", beta1},
                                   {"beta2", beta2},
                                   {"eps", eps},
                                   {"weight_decay", weight_decay},
                                   {"max_grad_norm", max_grad_norm},
                                   {"min_lr_ratio", min_lr_ratio},
                                   {"warmup_fraction", warmup_fraction},
                                   {"warmup_min_lr", warmup_min_lr},
                                   {"decay_fraction", decay_fraction},
                                   {"decay_min_lr_ratio", decay_min_lr_ratio},
                                   {"power_exponent", power_exponent}})
    MOE_CHECK(std::isfinite(value), "[config] optim.{}={} must be a finite number", key, value);
  MOE_CHECK(lr > 0.0, "[config] optim.lr={} must be positive", lr);
  MOE_CHECK(beta1 >= 0.0 && beta1 < 1.0, "[config] optim.beta1={} must be in [0, 1)", beta1);
  MOE_CHECK(beta2 >= 0.0 && beta2 < 1.0, "[config] optim.beta2={} must be in [0, 1)", beta2);
  MOE_CHECK(eps > 0.0, "[config] optim.eps={} must be positive", eps);
  MOE_CHECK(weight_decay >= 0.0, "[config] optim.weight_decay={} must be >= 0", weight_decay);
  MOE_CHECK(warmup_steps >= 0, "[config] optim.warmup_steps={} must be >= 0", warmup_steps);
  MOE_CHECK(warmup_fraction >= 0.0 && warmup_fraction <= 1.0,
            "[config] optim.warmup_fraction={} must be in [0, 1]", warmup_fraction);
  MOE_CHECK(warmup_fraction == 0.0 || warmup_steps == 0,
            "[config] optim.warmup_steps={} and optim.warmup_fraction={}: give one of them",
            warmup_steps, warmup_fraction);
  MOE_CHECK(decay_steps >= 0, "[config] optim.decay_steps={} must be >= 0", decay_steps);
  MOE_CHECK(warmup_tokens >= 0 && decay_tokens >= 0,
            "[config] optim.warmup_tokens={} and optim.decay_tokens={} must be >= 0", warmup_tokens,
            decay_tokens);
  MOE_CHECK(warmup_fraction == 0.0 || warmup_tokens == 0,
            "[config] optim.warmup_tokens={} and optim.warmup_fraction={}: give one of them",
            warmup_tokens, warmup_fraction);
  // A length in the other units would be read as a count of these.
  if (units == LrUnits::kTokens)
    MOE_CHECK(warmup_steps == 0 && decay_steps == 0,
              "[config] optim.units = \"tokens\" counts the schedule in tokens: give "
              "optim.warmup_tokens / decay_tokens (or the fractions), not optim.warmup_steps={} / "
              "decay_steps={}",
              warmup_steps, decay_steps);
  else
    MOE_CHECK(warmup_tokens == 0 && decay_tokens == 0,
              "[config] optim.warmup_tokens={} / decay_tokens={} count tokens: set optim.units = "
              "\"tokens\" (or give warmup_steps / decay_steps)",
              warmup_tokens, decay_tokens);
  MOE_CHECK(decay_fraction >= 0.0 && decay_fraction <= 1.0,
            "[config] optim.decay_fraction={} must be in [0, 1]", decay_fraction);
  // WSDS's floor may lie above lr when every period's peak is above it (its multipliers).
  MOE_CHECK(min_lr_ratio >= 0.0 && (min_lr_ratio <= 1.0 || schedule == LrSchedule::kWsds),
            "[config] optim.min_lr_ratio={} must be in [0, 1]{}", min_lr_ratio,
            schedule == LrSchedule::kWsds ? " (wsds: >= 0, below every period's multiplier)" : "");
  MOE_CHECK(decay_min_lr_ratio >= 0.0 && decay_min_lr_ratio <= 1.0,
            "[config] optim.decay_min_lr_ratio={} must be in [0, 1]", decay_min_lr_ratio);
  MOE_CHECK(t_max_steps >= 0 && t_max_tokens >= 0,
            "[config] optim.t_max_steps={} and optim.t_max_tokens={} must be >= 0 (0: the run's "
            "length)",
            t_max_steps, t_max_tokens);
  MOE_CHECK(units == LrUnits::kTokens ? t_max_steps == 0 : t_max_tokens == 0,
            "[config] optim.units = \"{}\" gives t_max in {}: set optim.{}, not optim.{}",
            units == LrUnits::kTokens ? "tokens" : "steps",
            units == LrUnits::kTokens ? "tokens" : "updates",
            units == LrUnits::kTokens ? "t_max_tokens" : "t_max_steps",
            units == LrUnits::kTokens ? "t_max_steps" : "t_max_tokens");
  MOE_CHECK(t_max_length(*this) == 0 || has_t_max(schedule),
            "[config] optim.t_max_{}={} applies to the cosine, linear, half_cos and "
            "cosine_linear_decay schedules (OLMo-core's with a t_max), not this one",
            units == LrUnits::kTokens ? "tokens" : "steps", t_max_length(*this));
  // OLMo-core's PowerLR refuses b >= 0: a law that does not decay.
  MOE_CHECK(power_exponent < 0.0, "[config] optim.power_exponent={} must be negative",
            power_exponent);
  MOE_CHECK(warmup_min_lr >= 0.0, "[config] optim.warmup_min_lr={} must be >= 0", warmup_min_lr);
  MOE_CHECK(warmup_min_lr == 0.0 || has_warmup(schedule),
            "[config] optim.warmup_min_lr={} applies to the schedules with a warm-up, not "
            "exponential or composable",
            warmup_min_lr);
  MOE_CHECK(std::isfinite(exponential_lr_min) && exponential_lr_min > 0.0,
            "[config] optim.exponential_lr_min={} must be positive", exponential_lr_min);
  MOE_CHECK(
      has_warmup(schedule) || (warmup_steps == 0 && warmup_tokens == 0 && warmup_fraction == 0.0),
      "[config] optim.schedule = \"{}\" has no warm-up of its own ({}): set "
      "optim.warmup_steps / warmup_tokens / warmup_fraction to 0",
      schedule == LrSchedule::kExponential ? "exponential" : "composable",
      schedule == LrSchedule::kExponential
          ? "it rises from optim.exponential_lr_min to lr over the run"
          : "a first stage from start_lr_fraction = 0 is one");
  MOE_CHECK(schedule == LrSchedule::kWsds ||
                (period_steps.empty() && period_tokens.empty() && period_lr_multipliers.empty()),
            "[config] optim.period_steps / period_tokens / period_lr_multipliers apply to "
            "optim.schedule = \"wsds\", not this one");
  if (schedule == LrSchedule::kWsds) validate_wsds(*this);
  MOE_CHECK(schedule == LrSchedule::kComposable || stages.empty(),
            "[config] optim.stages apply to optim.schedule = \"composable\", not this one");
  MOE_CHECK(
      schedule == LrSchedule::kComposable || schedule == LrSchedule::kSequential || !override_decay,
      "[config] optim.override_decay applies to optim.schedule = \"composable\" or "
      "\"sequential\", not this one");
  MOE_CHECK(schedule == LrSchedule::kSequential || sequence.empty(),
            "[config] optim.sequence applies to optim.schedule = \"sequential\", not this one");
  if (schedule == LrSchedule::kComposable) validate_composable(*this);
  validate_override_decay(*this);
  if (schedule == LrSchedule::kSequential) validate_sequence(*this);
  for (size_t k = 0; k < group_overrides.size(); ++k) {
    const OptimGroupOverride& go = group_overrides[k];
    MOE_CHECK(!go.params.empty(), "[config] optim.group_overrides[{}].params is empty", k);
    for (const std::string& pattern : go.params)
      MOE_CHECK(!pattern.empty(),
                "[config] optim.group_overrides[{}].params holds an empty pattern", k);
    for (const auto& [key, value] : {std::pair{"lr", go.lr},
                                     {"weight_decay", go.weight_decay},
                                     {"beta1", go.beta1},
                                     {"beta2", go.beta2},
                                     {"eps", go.eps}})
      MOE_CHECK(!value || std::isfinite(*value),
                "[config] optim.group_overrides[{}].{}={} must be a finite number", k, key, *value);
    // The ranges of [optim]'s own keys.
    MOE_CHECK(!go.lr || *go.lr > 0.0, "[config] optim.group_overrides[{}].lr={} must be positive",
              k, go.lr.value_or(0.0));
    MOE_CHECK(!go.weight_decay || *go.weight_decay >= 0.0,
              "[config] optim.group_overrides[{}].weight_decay={} must be >= 0", k,
              go.weight_decay.value_or(0.0));
    for (const auto& [key, beta] : {std::pair{"beta1", go.beta1}, {"beta2", go.beta2}})
      MOE_CHECK(!beta || (*beta >= 0.0 && *beta < 1.0),
                "[config] optim.group_overrides[{}].{}={} must be in [0, 1)", k, key,
                beta.value_or(0.0));
    MOE_CHECK(!go.eps || *go.eps > 0.0,
              "[config] optim.group_overrides[{}].eps={} must be positive", k,
              go.eps.value_or(0.0));
  }
}

RunConfig parse_run_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides, const ModelConfig& model_base,
                           ScheduleLength length) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    fail("[config] {}:{}:{}: malformed TOML: {}", source_name, where.line, where.column,
         e.description());
  }
  std::string length_set;  // the length key an override set, if any
  for (const std::string& o : overrides)
    apply_length_override(doc, apply_override(doc, o), length_set);

  RunConfig config;
  config.model = model_base;
  for (const auto& [key, node] : doc) {
    const std::string section(key.str());
    const toml::table* table = node.as_table();
    MOE_CHECK(table != nullptr, "[config] {}: top-level key '{}' must be a table", source_name,
              section);
    TableReader reader(*table, section, source_name);
    if (section == "model") {
      read_model(reader, config.model);
    } else if (section == "optim") {
      read_optim(reader, config.optim);
    } else if (section == "train") {
      read_train(reader, config.train);
    } else if (section == "data") {
      read_data(reader, config.data);
    } else if (section == "parallel") {
      read_parallel(reader, config.parallel);
    } else {
      fail("[config] {}: unknown table [{}] (expected model, optim, train, data, parallel)",
           source_name, section);
    }
    reader.reject_unknown();
  }
  config.model.validate();
  config.optim.validate();
  const TrainConfig& t = config.train;
  MOE_CHECK(t.max_steps >= 0, "[config] train.max_steps={} must be >= 0", t.max_steps);
  MOE_CHECK(t.init_seed >= -1, "[config] train.init_seed={} must be >= 0, or -1 (train.seed's)",
            t.init_seed);
  MOE_CHECK(std::isfinite(t.init.std) && t.init.std > 0.0,
            "[config] train.init_std={} must be finite and > 0", t.init.std);
  MOE_CHECK(t.init.embedding_std == -1.0 ||
                (std::isfinite(t.init.embedding_std) && t.init.embedding_std > 0.0),
            "[config] train.embedding_init_std={} must be finite and > 0, or -1 (train.init_std)",
            t.init.embedding_std);
  // Upper bounds far beyond any machine, so that no product of sizes (tokens x width x layers
  // in bytes, here and in `moecore plan`) can overflow 64 bits: 2^32 tokens a step.
  constexpr int64_t kMaxStepTokens = int64_t{1} << 32;
  MOE_CHECK(t.batch_size > 0 && t.batch_size <= kMaxStepTokens,
            "[config] train.batch_size={} must be in [1, {}]", t.batch_size, kMaxStepTokens);
  MOE_CHECK(t.seq_len > 0 && t.seq_len <= kMaxStepTokens,
            "[config] train.seq_len={} must be in [1, {}]", t.seq_len, kMaxStepTokens);
  MOE_CHECK(t.batch_size <= kMaxStepTokens / t.seq_len,
            "[config] train.batch_size={} x train.seq_len={} tokens a step: at most {}",
            t.batch_size, t.seq_len, kMaxStepTokens);
  // The run's length is one duration, as OLMo-core's max_duration: updates, tokens or epochs.
  MOE_CHECK(t.max_tokens >= 0, "[config] train.max_tokens={} must be >= 0 (0: train.max_steps)",
            t.max_tokens);
  MOE_CHECK(t.max_epochs >= 0, "[config] train.max_epochs={} must be >= 0 (0: train.max_steps)",
            t.max_epochs);
  const toml::table* train_table = doc["train"].as_table();
  const bool steps_given = train_table != nullptr && train_table->contains("max_steps");
  MOE_CHECK((t.max_tokens > 0) + (t.max_epochs > 0) +
                    ((t.max_tokens == 0 && t.max_epochs == 0) || steps_given) ==
                1,
            "[config] {}: {} set: the run's length is one of train.max_steps, train.max_tokens and "
            "train.max_epochs",
            source_name,
            steps_given && t.max_tokens > 0
                ? fmt::format("train.max_steps={} and train.max_tokens={} both", t.max_steps,
                              t.max_tokens)
            : steps_given ? fmt::format("train.max_steps={} and train.max_epochs={} both",
                                        t.max_steps, t.max_epochs)
                          : fmt::format("train.max_tokens={} and train.max_epochs={} both",
                                        t.max_tokens, t.max_epochs));
  MOE_CHECK(t.hard_stop_steps >= 0 && t.hard_stop_tokens >= 0 && t.hard_stop_epochs >= 0 &&
                (t.hard_stop_steps > 0) + (t.hard_stop_tokens > 0) + (t.hard_stop_epochs > 0) <= 1,
            "[config] train.hard_stop_steps={}, train.hard_stop_tokens={} and "
            "train.hard_stop_epochs={}: give at most one, > 0 (0: none)",
            t.hard_stop_steps, t.hard_stop_tokens, t.hard_stop_epochs);
  // OLMo-core's ModelMergeCallback's checks (a merge step's window must fit before it).
  MOE_CHECK(t.merge_last_n_steps > 0, "[config] train.merge_last_n_steps={} must be positive",
            t.merge_last_n_steps);
  MOE_CHECK(t.merge_interval >= 0, "[config] train.merge_interval={} must be >= 0 (0: none)",
            t.merge_interval);
  MOE_CHECK(t.merge_interval == 0 || t.merge_steps.empty(),
            "[config] train.merge_steps and train.merge_interval={}: give one of them",
            t.merge_interval);
  for (size_t i = 0; i < t.merge_steps.size(); ++i) {
    MOE_CHECK(t.merge_steps[i] > 0, "[config] train.merge_steps[{}]={} must be positive", i,
              t.merge_steps[i]);
    MOE_CHECK(i == 0 || t.merge_steps[i] > t.merge_steps[i - 1],
              "[config] train.merge_steps must increase: [{}]={} after {}", i, t.merge_steps[i],
              t.merge_steps[i - 1]);
    MOE_CHECK(t.merge_steps[i] >= t.merge_last_n_steps,
              "[config] train.merge_steps[{}]={} is below train.merge_last_n_steps={}: its window "
              "would hold {} updates",
              i, t.merge_steps[i], t.merge_last_n_steps, t.merge_steps[i]);
  }
  MOE_CHECK(t.merge_interval == 0 || t.merge_interval >= t.merge_last_n_steps,
            "[config] train.merge_interval={} is below train.merge_last_n_steps={}: the first "
            "merge's window would hold {} updates",
            t.merge_interval, t.merge_last_n_steps, t.merge_interval);
  if (t.max_tokens > 0) {
    config.train.max_steps = max_steps_for_tokens(t);
    // The tokens seen after the last update must fit a 64-bit count (the trainer's, the
    // checkpoints').
    MOE_CHECK(t.max_steps <= std::numeric_limits<int64_t>::max() / (t.batch_size * t.seq_len),
              "[config] train.max_tokens={} in updates of {} tokens: the last update's tokens "
              "overflow a 64-bit count",
              t.max_tokens, t.batch_size * t.seq_len);
  }
  if (t.max_epochs > 0) config.train.max_steps = 0;  // set once the training set is read
  // A length in epochs is known once the training set is read: the trainer checks it then.
  if (length == ScheduleLength::kFresh && t.max_epochs == 0)
    validate_lr_schedule(config.optim, t.max_steps, t.batch_size * t.seq_len, {}, t.max_tokens);
  MOE_CHECK(t.threads >= 0 && t.threads <= kMaxThreads,
            "[config] train.threads={} must be in [0, {}] (0: every core)", t.threads, kMaxThreads);
  for (const auto& [key, value] : {std::pair{"max_seconds", t.max_seconds},
                                   {"skip_sigma", t.skip_sigma},
                                   {"gerrymander_threshold", t.gerrymander_threshold}})
    MOE_CHECK(std::isfinite(value), "[config] train.{}={} must be a finite number", key, value);
  MOE_CHECK(t.eval_every >= 0, "[config] train.eval_every={} must be >= 0 (0 = never)",
            t.eval_every);
  MOE_CHECK(t.eval_batches >= 0,
            "[config] train.eval_batches={} must be >= 0 (0: the whole validation set, for the "
            "final evaluation)",
            t.eval_batches);
  MOE_CHECK(t.eval_every == 0 || t.eval_batches > 0,
            "[config] train.eval_batches={} must be positive when train.eval_every={} evaluates",
            t.eval_batches, t.eval_every);
  MOE_CHECK(t.downstream_eval_every == 0 || (t.downstream_eval_every > 0 && t.eval_every > 0 &&
                                             t.downstream_eval_every % t.eval_every == 0),
            "[config] train.downstream_eval_every={} must be 0 (every evaluation) or a positive "
            "multiple of train.eval_every={}",
            t.downstream_eval_every, t.eval_every);
  MOE_CHECK(t.lm_eval_every == 0 ||
                (t.lm_eval_every > 0 && t.eval_every > 0 && t.lm_eval_every % t.eval_every == 0),
            "[config] train.lm_eval_every={} must be 0 (every evaluation) or a positive multiple "
            "of train.eval_every={}",
            t.lm_eval_every, t.eval_every);
  MOE_CHECK(t.lm_eval_batches >= 0,
            "[config] train.lm_eval_batches={} must be >= 0 (0: every document of data.lm_eval)",
            t.lm_eval_batches);
  std::set<std::string> downstream_labels;
  for (size_t i = 0; i < t.downstream_tasks.size(); ++i) {
    const data::IclTaskSpec& task = t.downstream_tasks[i];
    MOE_CHECK(!task.path.empty(), "[config] train.downstream_tasks[{}].path is empty", i);
    MOE_CHECK(task.metric.empty() || data::parse_icl_metric(task.metric).has_value(),
              "[config] train.downstream_tasks[{}].metric '{}' is not one of acc, len_norm, "
              "pmi_dc, ce_loss, bpb, f1",
              i, task.metric);
    const std::string label = data::icl_task_label(task);
    MOE_CHECK(downstream_labels.insert(label).second,
              "[config] train.downstream_tasks[{}] is labelled '{}' as an earlier task: their "
              "metrics would share names (give a label)",
              i, label);
  }
  MOE_CHECK(t.microbatches > 0 && t.batch_size % t.microbatches == 0,
            "[config] train.microbatches={} must be positive and divide train.batch_size={}",
            t.microbatches, t.batch_size);
  validate_batch_size_schedule(config);
  validate_seq_len_warmup(config);
  MOE_CHECK(t.save_every >= 0, "[config] train.save_every={} must be >= 0", t.save_every);
  MOE_CHECK(t.lm_head_chunk_tokens >= 0,
            "[config] train.lm_head_chunk_tokens={} must be >= 0 (0 = the whole micro-batch)",
            t.lm_head_chunk_tokens);
  MOE_CHECK(std::isfinite(t.z_loss_multiplier) && t.z_loss_multiplier >= 0.0,
            "[config] train.z_loss_multiplier={} must be finite and >= 0 (0 = no LM-head z-loss)",
            t.z_loss_multiplier);
  MOE_CHECK(t.checkpoint || t.save_every == 0,
            "[config] train.save_every={} with train.checkpoint=false: a run without checkpoints "
            "saves none",
            t.save_every);
  MOE_CHECK(t.keep_last >= 0, "[config] train.keep_last={} must be >= 0", t.keep_last);
  MOE_CHECK(t.max_seconds >= 0.0, "[config] train.max_seconds={} must be >= 0", t.max_seconds);
  MOE_CHECK(t.skip_window > 0, "[config] train.skip_window={} must be positive", t.skip_window);
  // skip_min_window is the moecore rule's (OLMo-core's judges from skip_window / 2).
  MOE_CHECK(t.skip_rule != SkipRule::kMoecore ||
                (t.skip_min_window >= 0 && t.skip_min_window <= t.skip_window),
            "[config] train.skip_min_window={} must be in [0, train.skip_window={}]",
            t.skip_min_window, t.skip_window);
  // OLMo-core's rule judges from max(2, window / 2) values, the step's own among them: below 6 its
  // first judged step has a single earlier value, whose sample deviation is NaN (OLMo-core skips
  // that step for it).
  MOE_CHECK(t.skip_rule != SkipRule::kOlmoCore || t.skip_window >= 6,
            "[config] train.skip_window={} with train.skip_rule = \"olmo-core\" must be >= 6 "
            "(its first judged step needs a sample deviation of two earlier steps)",
            t.skip_window);
  MOE_CHECK(t.skip_max_consecutive >= 0,
            "[config] train.skip_max_consecutive={} must be >= 0 (0 = no limit)",
            t.skip_max_consecutive);
  MOE_CHECK(t.spike_window > 0 && t.spike_rolling_window > 0 && t.spike_threshold_std > 0.0 &&
                std::isfinite(t.spike_threshold_std),
            "[config] train.spike_window={} and train.spike_rolling_window={} must be positive and "
            "train.spike_threshold_std={} a positive number",
            t.spike_window, t.spike_rolling_window, t.spike_threshold_std);
  MOE_CHECK(t.gerrymander_window >= 0 && t.gerrymander_threshold > 0.0,
            "[config] train.gerrymander_window={} must be >= 0 and gerrymander_threshold={} > 0",
            t.gerrymander_window, t.gerrymander_threshold);
  MOE_CHECK(t.precision == TrainPrecision::kMxfp8 || (!t.mxfp8.expert_wgrad && !t.mxfp8.dense &&
                                                      t.mxfp8.scale_mode == mx::ScaleMode::kRceil),
            "[config] train.mxfp8_* are variants of train.precision=\"mxfp8\", not of \"{}\"",
            train_precision_name(t.precision));
  MOE_CHECK(t.sample_tokens >= 0, "[config] train.sample_tokens={} must be >= 0", t.sample_tokens);
  const ParallelConfig& p = config.parallel;
  MOE_CHECK(p.ep >= 1, "[config] parallel.ep={} must be >= 1", p.ep);
  MOE_CHECK(p.pp >= 1, "[config] parallel.pp={} must be >= 1", p.pp);
  // Each model chunk holds at least one layer.
  MOE_CHECK(p.virtual_stages >= 0 && p.virtual_stages <= config.model.num_hidden_layers,
            "[config] parallel.virtual_stages={} must be in [0, model.num_hidden_layers={}]",
            p.virtual_stages, config.model.num_hidden_layers);
  MOE_CHECK(p.zero == 0 || p.zero == 1, "[config] parallel.zero={} must be 0 or 1", p.zero);
  // Above ep nothing is ever dropped, so a larger factor only grows the receive buffers.
  MOE_CHECK(
      std::isfinite(p.capacity_factor) && p.capacity_factor > 0.0 && p.capacity_factor <= 1024.0,
      "[config] parallel.capacity_factor={} must be in (0, 1024]", p.capacity_factor);
  MOE_CHECK(p.rowwise_transport == RowwiseTransport::kAuto || p.dispatch == Dispatch::kRowwise,
            "[config] parallel.rowwise_transport=\"{}\" needs parallel.dispatch=\"rowwise\"",
            rowwise_transport_name(p.rowwise_transport));
  MOE_CHECK(p.rowwise_transport != RowwiseTransport::kWindow || t.device == Device::kCpu,
            "[config] parallel.rowwise_transport=\"window\" needs train.device=\"cpu\" (MPI's "
            "windows reach host memory only): use \"auto\" or \"padded\"");
  MOE_CHECK(p.rowwise_transport != RowwiseTransport::kSymmetric || t.device != Device::kCpu,
            "[config] parallel.rowwise_transport=\"symmetric\" needs train.device=\"cuda\" "
            "(its kernel stores into other GPUs' memory): use \"padded\" or \"auto\"");
  MOE_CHECK(t.log_every > 0, "[config] train.log_every={} must be positive", t.log_every);
  if (t.cuda_grouped_gemm == CudaGroupedGemm::kOneLaunch) {
    MOE_CHECK(t.device != Device::kCpu,
              "[config] train.cuda_grouped_gemm=\"one_launch\" needs train.device=\"cuda\" (it "
              "chooses the CUDA backend's expert kernels)");
    MOE_CHECK(t.precision != TrainPrecision::kFp32,
              "[config] train.cuda_grouped_gemm=\"one_launch\" needs train.precision \"bf16\" or "
              "\"mxfp8\": its kernels multiply bf16 operands");
  }
  const DataConfig& d = config.data;
  // A replayed graph keeps the host's arguments of its capture: what changes per step must reach
  // the kernels through device memory (train/step_graph.h), which these do not.
  if (t.cuda_graph) {
    MOE_CHECK(t.device != Device::kCpu,
              "[config] train.cuda_graph=true needs train.device=\"cuda\" (graphs capture a "
              "device's work)");
    MOE_CHECK(config.model.routing != Routing::kRandom,
              "[config] train.cuda_graph=true cannot replay model.routing=\"random\": its seed "
              "changes every step on the host");
    MOE_CHECK(config.model.loss_normalizer != LossNormalizer::kLabels,
              "[config] train.cuda_graph=true cannot replay model.loss_normalizer=\"labels\": "
              "the router losses divide by the host's count of targets");
    MOE_CHECK(!t.mxfp8.expert_wgrad,
              "[config] train.cuda_graph=true cannot capture train.mxfp8_expert_wgrad=true: its "
              "weight gradients pad each expert's rows on the host, which reads the offsets");
    MOE_CHECK(p.pp == 1,
              "[config] train.cuda_graph=true cannot capture parallel.pp={}: pipeline stages pass "
              "activations over MPI and sum their losses on the host",
              p.pp);
    MOE_CHECK(
        p.ep == 1 || (p.dispatch == Dispatch::kRowwise && moves_padded_blocks(p.rowwise_transport)),
        "[config] train.cuda_graph=true with parallel.ep={} needs parallel.dispatch="
        "\"rowwise\" and parallel.rowwise_transport=\"padded\" or \"symmetric\": the "
        "other exchanges size their transfers by counts read on the host",
        p.ep);
  }
  MOE_CHECK(d.dtype.empty() || d.dtype == "uint16" || d.dtype == "uint32" || d.dtype == "int32" ||
                d.dtype == "int64",
            "[config] data.dtype='{}' is not one of uint16, uint32, int32, int64", d.dtype);
  MOE_CHECK(d.eos_id >= -1 && d.eos_id < config.model.vocab_size,
            "[config] data.eos_id={} is outside [0, model.vocab_size={}) (-1: from the token "
            "files' meta.json)",
            d.eos_id, config.model.vocab_size);
  MOE_CHECK(d.bos_id >= -1 && d.bos_id < config.model.vocab_size,
            "[config] data.bos_id={} is outside [0, model.vocab_size={}) (-1: none)", d.bos_id,
            config.model.vocab_size);
  MOE_CHECK(data::is_max_target_seq_len(d.max_target_seq_len, config.train.seq_len),
            "[config] data.max_target_seq_len={} must be 0 (none) or a positive multiple of "
            "train.seq_len={}",
            d.max_target_seq_len, config.train.seq_len);
  MOE_CHECK(d.bos_id < 0 || d.document_masking,
            "[config] data.bos_id={} only says where documents end for data.document_masking, "
            "which is false",
            d.bos_id);
  validate_instance_filter(d);
  MOE_CHECK(d.val_label_mask.empty() || !d.val.empty(),
            "[config] data.val_label_mask lists label masks for data.val, which lists no files");
  for (size_t i = 0; i < d.lm_eval.size(); ++i) {
    const data::LmEvalSet& set = d.lm_eval[i];
    MOE_CHECK(!set.label.empty(),
              "[config] data.lm_eval[{}] has no label (the name its metrics carry: "
              "eval/lm/<label>/CE loss)",
              i);
    MOE_CHECK(!set.paths.empty(), "[config] data.lm_eval[{}] ('{}') lists no token files (paths)",
              i, set.label);
  }
  return config;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                          const ModelConfig& model_base, ScheduleLength length) {
  MOE_CHECK(std::filesystem::is_regular_file(path),
            "[config] cannot read config file '{}' (not a file)", path);
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[config] cannot open config file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), path, overrides, model_base, length);
}

std::string run_config_to_toml(const RunConfig& c) {
  auto list_of = [](const auto& values) {
    toml::array array;
    for (const auto& value : values) array.push_back(value);
    return array;
  };
  auto name = [](auto value, std::initializer_list<std::pair<decltype(value), const char*>> names) {
    for (const auto& [v, n] : names)
      if (v == value) return std::string(n);
    return std::string("?");
  };
  const ModelConfig& m = c.model;
  toml::table model{
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"num_hidden_layers", m.num_hidden_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"head_dim", m.head_dim},
      {"rope_theta", m.rope_theta},
      {"rms_norm_eps", m.rms_norm_eps},
      {"tie_word_embeddings", m.tie_word_embeddings},
      {"pad_token_id", m.pad_token_id},
      {"num_experts", m.num_experts},
      {"num_experts_per_tok", m.num_experts_per_tok},
      {"moe_intermediate_size", m.moe_intermediate_size},
      {"intermediate_size", m.intermediate_size},
      {"first_k_dense_replace", m.first_k_dense_replace},
      {"shared_expert_intermediate_size", m.shared_expert_intermediate_size},
      {"norm_topk_prob", m.norm_topk_prob},
      {"router_aux_loss_coef", m.router_aux_loss_coef},
      {"router_z_loss_coef", m.router_z_loss_coef},
      {"qk_norm",
       name(m.qk_norm,
            {{QkNorm::kNone, "none"}, {QkNorm::kFull, "full"}, {QkNorm::kPerHead, "per_head"}})},
      {"router_score", name(m.router_score, {{RouterScore::kSoftmax, "softmax"},
                                             {RouterScore::kSigmoid, "sigmoid"},
                                             {RouterScore::kTopkSoftmax, "topk_softmax"}})},
      {"lb_loss_style",
       name(m.lb_loss_style, {{LbLossStyle::kOlmoCore, "olmo-core"}, {LbLossStyle::kHf, "hf"}})},
      {"lb_loss_scope",
       name(m.lb_loss_scope, {{LbLossScope::kGlobal, "global"}, {LbLossScope::kRank, "rank"}})},
      {"lb_loss_granularity",
       name(m.lb_loss_granularity, {{LbLossGranularity::kLocalBatch, "local_batch"},
                                    {LbLossGranularity::kInstance, "instance"}})},
      {"routing", name(m.routing, {{Routing::kLearned, "learned"},
                                   {Routing::kRandom, "random"},
                                   {Routing::kBalanced, "balanced"}})},
      {"block_norm",
       name(m.block_norm, {{BlockNorm::kPre, "pre"}, {BlockNorm::kReordered, "reordered"}})},
      {"loss_normalizer", name(m.loss_normalizer, {{LossNormalizer::kTokens, "tokens"},
                                                   {LossNormalizer::kLabels, "labels"}})},
      {"n_group", m.n_group},
      {"topk_group", m.topk_group},
      {"routed_scaling_factor", m.routed_scaling_factor},
      {"router_bias_update_rate", m.router_bias_update_rate},
  };
  const OptimConfig& o = c.optim;
  toml::table optim{
      {"lr", o.lr},
      {"beta1", o.beta1},
      {"beta2", o.beta2},
      {"eps", o.eps},
      {"weight_decay", o.weight_decay},
      {"no_decay", name(o.no_decay, {{NoDecay::kNormsAndEmbeddings, "norms_and_embeddings"},
                                     {NoDecay::kEmbeddings, "embeddings"},
                                     {NoDecay::kNone, "none"}})},
      {"max_grad_norm", o.max_grad_norm},
      {"reset_optimizer_moments_on_load", o.reset_optimizer_moments_on_load},
      {"units", name(o.units, {{LrUnits::kSteps, "steps"}, {LrUnits::kTokens, "tokens"}})}};
  // The stages and the override decay with the keys they were given.
  auto shape_name = [](LrShape shape) { return shape == LrShape::kLinear ? "linear" : "cosine"; };
  auto put = [](toml::table& table, const char* key, const std::optional<double>& value) {
    if (value) table.insert(key, *value);
  };
  auto put_override_decay = [&](toml::table& table, const OptimConfig& s) {
    if (!s.override_decay) return;
    const LrOverrideDecay& d = *s.override_decay;
    toml::table decay{{"start", d.start}, {"duration", d.duration}, {"shape", shape_name(d.shape)}};
    put(decay, "end_lr", d.end_lr);
    put(decay, "end_lr_fraction", d.end_lr_fraction);
    table.insert("override_decay", std::move(decay));
  };
  // One schedule's keys (kScheduleKeys, the name, its override decay) into `table`: [optim]'s, or
  // a sequence entry's.
  auto put_schedule = [&](toml::table& table, const OptimConfig& s) {
    table.insert("warmup_steps", s.warmup_steps);
    table.insert("warmup_tokens", s.warmup_tokens);
    table.insert("warmup_fraction", s.warmup_fraction);
    table.insert("warmup_min_lr", s.warmup_min_lr);
    table.insert("schedule",
                 name(s.schedule, {{LrSchedule::kCosine, "cosine"},
                                   {LrSchedule::kLinear, "linear"},
                                   {LrSchedule::kConstant, "constant"},
                                   {LrSchedule::kWsd, "wsd"},
                                   {LrSchedule::kInvSqrt, "inv_sqrt"},
                                   {LrSchedule::kHalfCosine, "half_cos"},
                                   {LrSchedule::kCosineLinearDecay, "cosine_linear_decay"},
                                   {LrSchedule::kPower, "power"},
                                   {LrSchedule::kWsds, "wsds"},
                                   {LrSchedule::kExponential, "exponential"},
                                   {LrSchedule::kComposable, "composable"}}));
    table.insert("min_lr_ratio", s.min_lr_ratio);
    table.insert("decay_steps", s.decay_steps);
    table.insert("decay_tokens", s.decay_tokens);
    table.insert("decay_fraction", s.decay_fraction);
    table.insert("decay_min_lr_ratio", s.decay_min_lr_ratio);
    table.insert("power_exponent", s.power_exponent);
    table.insert("t_max_steps", s.t_max_steps);
    table.insert("t_max_tokens", s.t_max_tokens);
    table.insert("period_steps", list_of(s.period_steps));
    table.insert("period_tokens", list_of(s.period_tokens));
    table.insert("period_lr_multipliers", list_of(s.period_lr_multipliers));
    table.insert("exponential_lr_min", s.exponential_lr_min);
    toml::array stages;
    for (const LrStage& stage : s.stages) {
      toml::table entry{{"duration", stage.duration}, {"shape", shape_name(stage.shape)}};
      put(entry, "start_lr", stage.start_lr);
      put(entry, "start_lr_fraction", stage.start_lr_fraction);
      put(entry, "end_lr", stage.end_lr);
      put(entry, "end_lr_fraction", stage.end_lr_fraction);
      stages.push_back(std::move(entry));
    }
    if (!stages.empty()) table.insert("stages", std::move(stages));
    put_override_decay(table, s);
  };
  if (o.schedule == LrSchedule::kSequential) {
    // Only the sequence's own keys: its entries hold the schedules'.
    optim.insert("schedule", "sequential");
    toml::array sequence;
    for (size_t i = 0; i < o.sequence.size(); ++i) {
      toml::table entry;
      if (i + 1 < o.sequence.size()) entry.insert("max", o.sequence[i].sequence_max);
      put_schedule(entry, o.sequence[i]);
      sequence.push_back(std::move(entry));
    }
    optim.insert("sequence", std::move(sequence));
    put_override_decay(optim, o);
  } else {
    put_schedule(optim, o);
  }
  // The group overrides with the values they were given (written only when there are any).
  toml::array overrides;
  for (const OptimGroupOverride& go : o.group_overrides) {
    toml::array params;
    for (const std::string& pattern : go.params) params.push_back(pattern);
    toml::table entry{{"params", std::move(params)}};
    put(entry, "lr", go.lr);
    put(entry, "weight_decay", go.weight_decay);
    put(entry, "beta1", go.beta1);
    put(entry, "beta2", go.beta2);
    put(entry, "eps", go.eps);
    overrides.push_back(std::move(entry));
  }
  if (!overrides.empty()) optim.insert("group_overrides", std::move(overrides));
  const TrainConfig& t = c.train;
  toml::table train{{"seed", static_cast<int64_t>(t.seed)},
                    {"init_seed", t.init_seed},
                    {"init_method", name(t.init.method, {{InitMethod::kMoecore, "moecore"},
                                                         {InitMethod::kNormal, "normal"},
                                                         {InitMethod::kLlama, "llama"},
                                                         {InitMethod::kLlamaDepth, "llama_depth"},
                                                         {InitMethod::kFanIn, "fan_in"}})},
                    {"init_std", t.init.std},
                    {"embedding_init_std", t.init.embedding_std},
                    {"hard_stop_steps", t.hard_stop_steps},
                    {"hard_stop_tokens", t.hard_stop_tokens},
                    {"hard_stop_epochs", t.hard_stop_epochs},
                    {"merge_steps", list_of(t.merge_steps)},
                    {"merge_interval", t.merge_interval},
                    {"merge_last_n_steps", t.merge_last_n_steps},
                    {"batch_size", t.batch_size},
                    {"microbatches", t.microbatches},
                    {"batch_sizes", list_of(t.batch_sizes)},
                    {"batch_size_starts", list_of(t.batch_size_starts)},
                    {"batch_size_units", batch_size_units_name(t.batch_size_units)},
                    {"seq_len", t.seq_len},
                    {"seq_len_warmup_steps", t.seq_len_warmup_steps},
                    {"seq_len_warmup_min", t.seq_len_warmup_min},
                    {"seq_len_warmup_truncate", t.seq_len_warmup_truncate},
                    {"seq_len_warmup_multiple", t.seq_len_warmup_multiple},
                    {"threads", t.threads},
                    {"device", std::string(device_name(t.device))},
                    {"precision", train_precision_name(t.precision)},
                    {"mxfp8_expert_wgrad", t.mxfp8.expert_wgrad},
                    {"mxfp8_dense", t.mxfp8.dense},
                    {"mxfp8_scale", std::string(mx::scale_mode_name(t.mxfp8.scale_mode))},
                    {"recompute", recompute_name(t.recompute)},
                    {"lm_head_chunk_tokens", t.lm_head_chunk_tokens},
                    {"z_loss_multiplier", t.z_loss_multiplier},
                    {"log_every", t.log_every},
                    {"eval_every", t.eval_every},
                    {"downstream_eval_every", t.downstream_eval_every},
                    {"lm_eval_every", t.lm_eval_every},
                    {"eval_batches", t.eval_batches},
                    {"lm_eval_batches", t.lm_eval_batches},
                    {"save_every", t.save_every},
                    {"checkpoint", t.checkpoint},
                    {"keep_last", t.keep_last},
                    {"max_seconds", t.max_seconds},
                    {"skip_sigma", t.skip_sigma},
                    {"skip_window", t.skip_window},
                    {"skip_min_window", t.skip_min_window},
                    {"skip_rule", name(t.skip_rule, {{SkipRule::kMoecore, "moecore"},
                                                     {SkipRule::kOlmoCore, "olmo-core"}})},
                    {"skip_max_consecutive", t.skip_max_consecutive},
                    {"gerrymander_window", t.gerrymander_window},
                    {"gerrymander_threshold", t.gerrymander_threshold},
                    {"stability_monitor", t.stability_monitor},
                    {"spike_window", t.spike_window},
                    {"spike_rolling_window", t.spike_rolling_window},
                    {"spike_threshold_std", t.spike_threshold_std},
                    {"sample_prompt", t.sample_prompt},
                    {"sample_tokens", t.sample_tokens},
                    {"profile", t.profile},
                    {"cuda_graph", t.cuda_graph},
                    {"cuda_grouped_gemm", std::string(cuda_grouped_gemm_name(t.cuda_grouped_gemm))},
                    {"out_dir", t.out_dir}};
  toml::table data{{"train", list_of(c.data.train)},
                   {"val", list_of(c.data.val)},
                   {"label_mask", list_of(c.data.label_mask)},
                   {"val_label_mask", list_of(c.data.val_label_mask)},
                   {"tokenizer", c.data.tokenizer},
                   {"dtype", c.data.dtype},
                   {"document_masking", c.data.document_masking},
                   {"eos_id", c.data.eos_id},
                   {"bos_id", c.data.bos_id},
                   {"max_target_seq_len", c.data.max_target_seq_len},
                   {"instance_filter", c.data.instance_filter},
                   {"repetition_max_period", c.data.repetition.max_period},
                   {"repetition_min_period", c.data.repetition.min_period},
                   {"repetition_max_count", c.data.repetition.max_count},
                   {"order", name(c.data.order, {{data::OrderRule::kMoecore, "moecore"},
                                                 {data::OrderRule::kOlmoCore, "olmo-core"}})}};
  // The run's length as it was given: a derived max_steps read back beside max_tokens or
  // max_epochs would be refused as a second length.
  if (t.max_tokens > 0)
    train.insert("max_tokens", t.max_tokens);
  else if (t.max_epochs > 0)
    train.insert("max_epochs", t.max_epochs);
  else
    train.insert("max_steps", t.max_steps);
  // The downstream tasks as given (written only when there are any).
  toml::array downstream;
  for (const data::IclTaskSpec& task : t.downstream_tasks) {
    toml::table entry{{"path", task.path}};
    if (!task.label.empty()) entry.insert("label", task.label);
    if (!task.metric.empty()) entry.insert("metric", task.metric);
    if (task.fast_mc) entry.insert("fast_mc", true);
    downstream.push_back(std::move(entry));
  }
  if (!downstream.empty()) train.insert("downstream_tasks", std::move(downstream));
  // The labelled validation sets (written only when there are any).
  toml::array lm_eval;
  for (const data::LmEvalSet& set : c.data.lm_eval) {
    toml::table entry{{"label", set.label}, {"paths", list_of(set.paths)}};
    if (!set.label_mask.empty()) entry.insert("label_mask", list_of(set.label_mask));
    lm_eval.push_back(std::move(entry));
  }
  if (!lm_eval.empty()) data.insert("lm_eval", std::move(lm_eval));
  const ParallelConfig& p = c.parallel;
  const char* schedule = p.schedule == PipelineSchedule::kOneFOneB      ? "1f1b"
                         : p.schedule == PipelineSchedule::kInterleaved ? "interleaved-1f1b"
                                                                        : "gpipe";
  toml::table parallel{{"pp", p.pp},
                       {"schedule", schedule},
                       {"virtual_stages", p.virtual_stages},
                       {"stage_layers", list_of(p.stage_layers)},
                       {"ep", p.ep},
                       {"zero", p.zero},
                       {"dispatch", p.dispatch == Dispatch::kSync ? "sync" : "rowwise"},
                       {"capacity_factor", p.capacity_factor},
                       {"rowwise_transport", rowwise_transport_name(p.rowwise_transport)},
                       {"overlap_grad_reduce", p.overlap_grad_reduce},
                       {"communicator", name(p.communicator, {{CommunicatorKind::kAuto, "auto"},
                                                              {CommunicatorKind::kMpi, "mpi"},
                                                              {CommunicatorKind::kNccl, "nccl"}})}};
  toml::table doc{
      {"model", model}, {"optim", optim}, {"train", train}, {"data", data}, {"parallel", parallel}};
  std::ostringstream out;
  out << doc << "\n";
  return out.str();
}

std::string model_config_difference(const ModelConfig& a, const ModelConfig& b) {
  // Each [model] key is one "key = value" line of the serialised table, in the same order.
  auto lines = [](const ModelConfig& m) {
    RunConfig r;
    r.model = m;
    const toml::table doc = toml::parse(run_config_to_toml(r));
    std::ostringstream text;
    text << *doc["model"].as_table();
    std::vector<std::string> out;
    std::istringstream in(text.str());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  // The loss coefficients, the load-balancing loss's form and scope and what divides the router
  // losses shape the training, not the weights: they are resume-policy keys
  // (train/resume_policy.h), not architecture.
  auto is_loss_key = [](const std::string& line) {
    for (const char* key : {"router_aux_loss_coef ", "router_z_loss_coef ", "lb_loss_style ",
                            "lb_loss_scope ", "lb_loss_granularity ", "loss_normalizer "})
      if (line.rfind(key, 0) == 0) return true;
    return false;
  };
  const std::vector<std::string> la = lines(a), lb = lines(b);
  for (size_t i = 0; i < la.size() && i < lb.size(); ++i)
    if (la[i] != lb[i] && !is_loss_key(la[i])) return fmt::format("model: {} vs {}", la[i], lb[i]);
  return "";
}

}  // namespace moecore
