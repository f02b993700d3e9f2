#include "data/icl_task.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "data/python_int_set_order.h"
#include "data/tokenizer_byte_level.h"
#include "io/file_util.h"
#include "io/gzip_file.h"

namespace moecore::data {

namespace {

constexpr const char* kTag = "[downstream]";
// oe-eval numbers its unconditional requests from here (config.json's uncond_docid_offset);
// olmo_eval skips them.
constexpr int64_t kUnconditionalDocIdStart = 1000000;

// Python's len() of a str: code points, i.e. the UTF-8 bytes that do not continue a character.
int64_t code_points(std::string_view utf8) {
  int64_t n = 0;
  for (const char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::optional<IclMetric> metric_of_config(const std::filesystem::path& config_path,
                                          std::string& primary_metric) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(io::read_text(config_path.string(), kTag));
  } catch (const nlohmann::json::exception& e) {
    fail("{} {} is not valid JSON ({})", kTag, config_path.string(), e.what());
  }
  if (!config.is_object() || !config.contains("task_config") || !config["task_config"].is_object())
    return std::nullopt;
  const nlohmann::json& task_config = config["task_config"];
  if (!task_config.contains("primary_metric") || !task_config["primary_metric"].is_string())
    return std::nullopt;
  primary_metric = task_config["primary_metric"].get<std::string>();
  return icl_metric_of_oe_eval(primary_metric);
}

// A request's integer field.
int64_t integer_field(const nlohmann::json& request, const char* key, const std::string& where) {
  MOE_CHECK(request.contains(key) && request[key].is_number_integer(),
            "{} {}: '{}' is missing or not an integer", kTag, where, key);
  return request[key].get<int64_t>();
}

// OEEvalTask's fast MC over its samples: per document, in the order olmo_eval's set of doc_ids
// iterates them (data/python_int_set_order.h), its samples sorted by cont_id (stably); the first
// is the base, whose query every choice is scored after; each sample's one-token continuation a
// choice, numbered in that order, carrying the base's label and lengths (olmo_eval's metric
// divides every choice by the base's cont_str_len and cont_byte_len).
std::vector<IclSample> fast_mc_samples(const std::vector<IclSample>& samples,
                                       const std::string& label) {
  std::map<int64_t, std::vector<size_t>> by_document;
  std::vector<int64_t> doc_ids;
  for (size_t i = 0; i < samples.size(); ++i) {
    by_document[samples[i].doc_id].push_back(i);
    doc_ids.push_back(samples[i].doc_id);
  }
  std::vector<IclSample> out;
  for (const int64_t doc_id : python_int_set_order(doc_ids)) {
    std::vector<size_t>& indices = by_document[doc_id];
    std::stable_sort(indices.begin(), indices.end(), [&samples](size_t a, size_t b) {
      return samples[a].cont_id < samples[b].cont_id;
    });
    const auto base = static_cast<int64_t>(out.size());
    for (size_t choice = 0; choice < indices.size(); ++choice) {
      const IclSample& s = samples[indices[choice]];
      MOE_CHECK(s.continuation.size() == 1,
                "{} task {}: fast_mc scores one-token continuations, but document {}'s "
                "continuation {} is {} tokens",
                kTag, label, doc_id, s.cont_id, s.continuation.size());
      IclSample c = samples[indices[0]];
      c.cont_id = static_cast<int64_t>(choice);
      c.continuation = s.continuation;
      c.shared_query = choice == 0 ? -1 : base;
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

std::optional<IclMetric> icl_metric_of_oe_eval(std::string_view primary_metric) {
  if (primary_metric == "acc_raw") return IclMetric::kAcc;
  if (primary_metric == "acc_per_char") return IclMetric::kLenNorm;
  if (primary_metric == "acc_uncond") return IclMetric::kPmiDc;
  if (primary_metric == "logits_per_byte") return IclMetric::kBpb;
  return std::nullopt;
}

IclTask load_icl_task(const IclTaskSpec& spec, const Tokenizer& tokenizer, int32_t bos_id,
                      int64_t model_ctx_len) {
  namespace fs = std::filesystem;
  MOE_CHECK(model_ctx_len >= 1, "{} the context length {} must be positive", kTag, model_ctx_len);
  const fs::path dir(spec.path);
  MOE_CHECK(fs::is_directory(dir), "{} task directory {} does not exist", kTag, spec.path);
  fs::path requests_path = dir / "requests.jsonl.gz";
  if (!fs::is_regular_file(requests_path)) requests_path = dir / "requests.jsonl";
  MOE_CHECK(fs::is_regular_file(requests_path),
            "{} {} holds neither requests.jsonl.gz nor requests.jsonl", kTag, spec.path);

  IclTask task;
  task.path = spec.path;
  task.label = icl_task_label(spec);
  task.fast_mc = spec.fast_mc;
  if (!spec.metric.empty()) {
    const std::optional<IclMetric> metric = parse_icl_metric(spec.metric);
    MOE_CHECK(metric.has_value(),
              "{} task {}: metric '{}' is not one of acc, len_norm, pmi_dc, ce_loss, bpb, f1", kTag,
              task.label, spec.metric);
    task.metric = *metric;
  } else {
    const fs::path config_path = dir / "config.json";
    MOE_CHECK(fs::is_regular_file(config_path),
              "{} task {}: no metric given and {} has no config.json to take its primary_metric "
              "from",
              kTag, task.label, spec.path);
    std::string primary;
    const std::optional<IclMetric> metric = metric_of_config(config_path, primary);
    MOE_CHECK(metric.has_value(),
              "{} task {}: {}'s primary_metric '{}' has no olmo_eval metric type (acc_raw, "
              "acc_per_char, acc_uncond, logits_per_byte): give the task a metric",
              kTag, task.label, config_path.string(), primary);
    task.metric = *metric;
  }
  const bool gold_only = task.metric == IclMetric::kCeLoss || task.metric == IclMetric::kBpb;

  const std::string text = io::read_maybe_gzip_file(requests_path.string(), kTag);
  const std::vector<int32_t> dc = tokenizer.encode(" ");  // OEEvalTask's domain conditional
  std::set<int64_t> documents;
  size_t begin = 0;
  for (int64_t line_no = 1; begin < text.size(); ++line_no) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    const std::string where = fmt::format("{} line {}", requests_path.string(), line_no);
    nlohmann::json request;
    try {
      request = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{} {}: not a JSON request ({})", kTag, where, e.what());
    }
    MOE_CHECK(request.is_object(), "{} {}: not a JSON object", kTag, where);
    const int64_t doc_id = integer_field(request, "doc_id", where);
    if (doc_id >= kUnconditionalDocIdStart) continue;
    MOE_CHECK(doc_id >= 0, "{} {}: doc_id {} is negative", kTag, where, doc_id);
    const std::string type = request.contains("request_type") && request["request_type"].is_string()
                                 ? request["request_type"].get<std::string>()
                                 : std::string("(none)");
    MOE_CHECK(type == "loglikelihood" || type == "generate_until_and_loglikelihood",
              "{} {}: request_type '{}' is not a loglikelihood request", kTag, where, type);
    MOE_CHECK(request.contains("request") && request["request"].is_object() &&
                  request["request"].contains("context") &&
                  request["request"]["context"].is_string() &&
                  request["request"].contains("continuation") &&
                  request["request"]["continuation"].is_string(),
              "{} {}: 'request' needs the strings 'context' and 'continuation'", kTag, where);
    const std::string context = request["request"]["context"].get<std::string>();
    const std::string continuation = request["request"]["continuation"].get<std::string>();
    int64_t cont_id = integer_field(request, "idx", where);
    MOE_CHECK(cont_id >= 0, "{} {}: idx {} is negative", kTag, where, cont_id);
    const nlohmann::json label = request.contains("label") ? request["label"] : nlohmann::json();
    int64_t label_id = 0;
    if (gold_only) {
      // olmo_eval: a missing label is 0; a string or list label (a generation task's answer)
      // marks this continuation as the one scored; an integer one keeps only its continuation.
      if (label.is_number_integer() && label.get<int64_t>() != cont_id) continue;
      MOE_CHECK(
          label.is_null() || label.is_number_integer() || label.is_string() || label.is_array(),
          "{} {}: 'label' is neither an integer, a string, a list nor null", kTag, where);
      if (label.is_null() && cont_id != 0) continue;  // label None -> 0
      cont_id = 0;
      label_id = 0;
    } else {
      MOE_CHECK(label.is_number_integer(),
                "{} {}: metric {} needs an integer 'label' (the gold continuation's idx)", kTag,
                where, icl_metric_name(task.metric));
      label_id = label.get<int64_t>();
    }

    IclSample s;
    s.doc_id = doc_id;
    s.cont_id = cont_id;
    s.label_id = label_id;
    std::vector<int32_t> ctx = tokenizer.encode(context);
    MOE_CHECK(!ctx.empty(), "{} {}: the context tokenizes to nothing", kTag, where);
    if (bos_id >= 0 && ctx.front() != bos_id) ctx.insert(ctx.begin(), bos_id);
    MOE_CHECK(!continuation.empty(), "{} {}: the continuation is empty", kTag, where);
    s.continuation = tokenizer.encode(continuation);
    const int64_t cont_len = static_cast<int64_t>(s.continuation.size());
    MOE_CHECK(cont_len >= 1 && cont_len <= model_ctx_len,
              "{} {}: the continuation is {} tokens, more than the context length {}", kTag, where,
              cont_len, model_ctx_len);
    s.query = ctx;
    s.query.insert(s.query.end(), s.continuation.begin(), s.continuation.end() - 1);
    if (static_cast<int64_t>(s.query.size()) > model_ctx_len)
      s.query.erase(s.query.begin(), s.query.end() - model_ctx_len);
    s.ctx_len = static_cast<int64_t>(s.query.size()) - cont_len + 1;
    s.dc_query = dc;
    s.dc_query.insert(s.dc_query.end(), s.continuation.begin(), s.continuation.end() - 1);
    s.dc_len = static_cast<int64_t>(dc.size());
    s.cont_str_len = code_points(continuation);
    s.cont_byte_len = static_cast<int64_t>(continuation.size());
    s.cont_str_len_no_leading_space = s.cont_str_len - 1;
    char32_t first_char = 0;
    s.cont_byte_len_no_leading_space =
        static_cast<int64_t>(continuation.size() - utf8_next(continuation, 0, first_char));
    documents.insert(doc_id);
    task.samples.push_back(std::move(s));
  }
  MOE_CHECK(!task.samples.empty(), "{} task {}: {} holds no request to score", kTag, task.label,
            requests_path.string());
  task.documents = static_cast<int64_t>(documents.size());
  if (task.fast_mc) task.samples = fast_mc_samples(task.samples, task.label);
  return task;
}

}  // namespace moecore::data
