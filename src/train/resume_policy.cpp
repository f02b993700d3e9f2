#include "train/resume_policy.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <sstream>

namespace moecore {

namespace {

// One line, whatever the value (a change is listed in a one-line error): tables and arrays inline.
std::string node_text(const toml::node* node) {
  if (node == nullptr) return "(unset)";
  // Shortest round-trip form (0.003, not toml++'s 0.0030000000000000001).
  if (const auto value = node->value_exact<double>()) return fmt::format("{}", *value);
  if (const toml::array* array = node->as_array()) {
    std::string text = "[";
    for (size_t i = 0; i < array->size(); ++i)
      text += (i == 0 ? "" : ", ") + node_text(array->get(i));
    return text + "]";
  }
  if (const toml::table* table = node->as_table()) {
    std::string text = "{";
    for (const auto& [key, value] : *table)
      text += (text.size() == 1 ? "" : ", ") + std::string(key.str()) + " = " + node_text(&value);
    return text + "}";
  }
  std::ostringstream out;
  node->visit([&out](const auto& value) { out << value; });
  return out.str();
}

}  // namespace

std::vector<ConfigChange> replay_config_changes(const RunConfig& saved, const RunConfig& now) {
  // Both sides through the same serialiser, so equal values print equally.
  const toml::table a = toml::parse(run_config_to_toml(saved));
  const toml::table b = toml::parse(run_config_to_toml(now));
  std::vector<std::string> keys = {"model.router_aux_loss_coef", "model.router_z_loss_coef",
                                   "model.lb_loss_style",        "model.lb_loss_scope",
                                   "model.lb_loss_granularity",  "model.loss_normalizer",
                                   "train.z_loss_multiplier"};
  // Every [optim] key either side has (the stages and the override decay are written only when
  // set, so one that was removed is in the saved config alone).
  for (const toml::table* optim : {b["optim"].as_table(), a["optim"].as_table()})
    for (const auto& [key, node] : *optim) {
      const std::string name = "optim." + std::string(key.str());
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) keys.push_back(name);
    }
  // The device: another backend's kernels round differently (the CPU's and a GPU's GEMMs sum in
  // other orders), so a run moved between them continues close to, not exactly on, its path. So
  // does a run whose LM head changes its chunks (the head's weight gradient adds the chunks'
  // products in another order, model/chunked_lm_head.h).
  // mxfp8's variants quantise other GEMMs or round their scales otherwise.
  for (const char* key : {"seed",
                          "batch_size",
                          "microbatches",
                          "batch_sizes",
                          "batch_size_starts",
                          "batch_size_units",
                          "seq_len",
                          "seq_len_warmup_steps",
                          "seq_len_warmup_min",
                          "seq_len_warmup_truncate",
                          "seq_len_warmup_multiple",
                          "precision",
                          "mxfp8_expert_wgrad",
                          "mxfp8_dense",
                          "mxfp8_scale",
                          "device",
                          "lm_head_chunk_tokens",
                          "skip_sigma",
                          "skip_window",
                          "skip_min_window",
                          "skip_rule"})
    keys.push_back(std::string("train.") + key);
  // The tokens the run reads (their element type, their order) and where its documents end (the
  // attention's masks: document_masking, eos_id).
  for (const char* key : {"train", "label_mask", "dtype", "document_masking", "eos_id", "bos_id",
                          "order", "max_target_seq_len", "instance_filter", "repetition_max_period",
                          "repetition_min_period", "repetition_max_count"})
    keys.push_back(std::string("data.") + key);
  // Which tokens an expert-parallel run drops (the rowwise dispatch's capacity; ep = 1 drops none).
  if (saved.parallel.ep > 1 || now.parallel.ep > 1) keys.push_back("parallel.capacity_factor");

  std::vector<ConfigChange> changes;
  for (const std::string& key : keys) {
    const size_t dot = key.find('.');
    const std::string table = key.substr(0, dot), name = key.substr(dot + 1);
    // An empty data.dtype reads the meta.json's, which an explicit one must equal (TokenDataset):
    // the same tokens either way. The EOS only ends documents under document masking.
    if (key == "data.dtype" && (saved.data.dtype.empty() || now.data.dtype.empty())) continue;
    if (key == "data.eos_id" && !saved.data.document_masking && !now.data.document_masking)
      continue;
    const std::string before = node_text(a[table][name].node());
    const std::string after = node_text(b[table][name].node());
    if (before != after) changes.push_back({key, before, after});
  }
  return changes;
}

bool resets_moments(const RunConfig& saved, const RunConfig& now) {
  return now.optim.reset_optimizer_moments_on_load && !saved.optim.reset_optimizer_moments_on_load;
}

std::string horizon_note(const RunConfig& saved, const RunConfig& now, TokenOrigin saved_origin,
                         TokenOrigin now_origin) {
  // A schedule without an end (unless a fraction of the run is its warm-up), over its own periods
  // (wsds) or stages (composable), or over its own t_max (cosine_linear_decay's tail still
  // follows the run's end), does not move with max_steps.
  const OptimConfig& o = now.optim;
  const bool endless =
      ((o.schedule == LrSchedule::kConstant || o.schedule == LrSchedule::kInvSqrt) &&
       o.warmup_fraction == 0.0) ||
      o.schedule == LrSchedule::kWsds || o.schedule == LrSchedule::kComposable;
  const bool own_t_max =
      t_max_length(o) > 0 && has_t_max(o.schedule) && o.schedule != LrSchedule::kCosineLinearDecay;
  if (endless || own_t_max) return "";
  const TrainConfig &was = saved.train, &is = now.train;
  const bool in_tokens = o.units == LrUnits::kTokens;
  const bool resized = was.batch_size * was.seq_len != is.batch_size * is.seq_len;
  auto length = [](const TrainConfig& t) {
    return t.max_tokens > 0   ? fmt::format("train.max_tokens {}", t.max_tokens)
           : t.max_epochs > 0 ? fmt::format("train.max_epochs {}", t.max_epochs)
                              : fmt::format("train.max_steps {}", t.max_steps);
  };
  const bool same_unit =
      (was.max_tokens > 0) == (is.max_tokens > 0) && (was.max_epochs > 0) == (is.max_epochs > 0);
  std::string what;
  if (!same_unit) {
    what = length(was) + " -> " + length(is);
  } else if (was.max_tokens > 0) {
    if (was.max_tokens != is.max_tokens) {
      what = length(was) + " -> " + std::to_string(is.max_tokens);
    } else if (!in_tokens) {
      // The same train.max_tokens in other updates: the end in updates moves.
      const int64_t before = max_steps_for_tokens(was, saved_origin);
      const int64_t after = max_steps_for_tokens(is, now_origin);
      if (before != after)
        what = fmt::format(
            "another batch size x seq_len (train.max_tokens {} in {} updates instead of {})",
            is.max_tokens, after, before);
    }
  } else if (was.max_epochs > 0) {
    // The same epochs in updates of another batch: the end moves in updates and in tokens (the
    // epochs' tails that no whole batch fills).
    if (was.max_epochs != is.max_epochs)
      what = length(was) + " -> " + std::to_string(is.max_epochs);
    else if (was.batch_size != is.batch_size || was.seq_len != is.seq_len)
      what = fmt::format("another batch size or seq_len (train.max_epochs {} in its updates)",
                         is.max_epochs);
  } else if (was.max_steps != is.max_steps) {
    what = length(was) + " -> " + std::to_string(is.max_steps);
  } else if (in_tokens && resized) {
    // In tokens the end is the tokens seen and the remaining updates' tokens: another batch size
    // or seq_len moves it too.
    what = "another batch size x seq_len (optim.units = \"tokens\")";
  }
  if (what.empty()) return "";
  return "note: " + what +
         " moves the learning-rate schedule's end: from here on the run is not the one it would "
         "have been";
}

std::string describe(const ConfigChange& change) {
  return change.key + ": " + change.before + " -> " + change.after;
}

}  // namespace moecore
