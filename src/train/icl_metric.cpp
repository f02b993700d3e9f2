#include "train/icl_metric.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "core/check.h"

namespace moecore {

namespace {

constexpr double kLog2OfE = 1.44269504089;  // olmo_eval's LOG_2_OF_E, as written there

// What update() records for one sample, each in fp32 as torch computes it.
struct SampleValues {
  float loglikelihood, celoss, bpb;
  float loglikelihood_nls, celoss_nls, bpb_nls;  // "no leading space" (v1)
};

SampleValues sample_values(data::IclMetric metric, const data::IclSample& s,
                           const IclScore& score) {
  const float sum = static_cast<float>(score.logprob);
  const float log2e = static_cast<float>(kLog2OfE);
  const auto over = [](float x, int64_t n) { return x / static_cast<float>(n); };
  SampleValues v{};
  switch (metric) {
    case data::IclMetric::kPmiDc: {
      v.loglikelihood = sum / static_cast<float>(score.dc_logprob);
      v.celoss = -v.loglikelihood;
      v.bpb = -v.loglikelihood;  // the normalisers cancel
      v.loglikelihood_nls = v.loglikelihood;
      v.celoss_nls = v.celoss;
      v.bpb_nls = v.bpb;
      break;
    }
    case data::IclMetric::kAcc:
    case data::IclMetric::kF1:
      v.loglikelihood = sum;
      v.celoss = over(-sum, s.cont_str_len);
      v.bpb = over(-sum, s.cont_byte_len) * log2e;
      v.loglikelihood_nls = sum;
      v.celoss_nls = over(-sum, s.cont_str_len_no_leading_space);
      v.bpb_nls = over(-sum, s.cont_byte_len_no_leading_space) * log2e;
      break;
    case data::IclMetric::kLenNorm:
    case data::IclMetric::kCeLoss:
    case data::IclMetric::kBpb:
      v.loglikelihood = over(sum, s.cont_str_len);
      v.celoss = over(-sum, s.cont_str_len);
      v.bpb = over(-sum, s.cont_byte_len) * log2e;
      v.loglikelihood_nls = over(sum, s.cont_str_len_no_leading_space);
      v.celoss_nls = over(-sum, s.cont_str_len_no_leading_space);
      v.bpb_nls = over(-sum, s.cont_byte_len_no_leading_space) * log2e;
      break;
  }
  return v;
}

// torch.argmax over a float tensor: the first maximum, a NaN counting as the largest.
size_t argmax(const std::vector<float>& x) {
  size_t best = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// torch.softmax / log_softmax over a small fp32 vector, at index `at`, as its CPU kernel computes
// them: exp(x - max) in fp32, summed, then times 1 / sum (softmax) or x - max - log(sum)
// (log_softmax). Its exp is a vectorised one (within an ulp), ours the correctly rounded one.
float softmax_at(const std::vector<float>& x, size_t at, bool log) {
  float max = -std::numeric_limits<float>::infinity();
  for (const float v : x) max = std::max(max, v);
  const auto exp = [](float v) { return static_cast<float>(std::exp(static_cast<double>(v))); };
  float sum = 0.0f;
  for (const float v : x) sum += exp(v - max);
  if (log) return (x[at] - max) - static_cast<float>(std::log(static_cast<double>(sum)));
  return exp(x[at] - max) * (1.0f / sum);
}

// A Python float as torch.tensor() holds it: rounded to fp32.
double fp32(double x) {
  return static_cast<double>(static_cast<float>(x));
}

// sum(x) / len(x) of Python floats (left to right, in double), as torch.tensor() then holds it.
double mean(const std::vector<double>& x) {
  double sum = 0.0;
  for (const double v : x) sum += v;
  return fp32(sum / static_cast<double>(x.size()));
}

// The same of fp32 tensors (ce_loss and bpb keep each document's value as a 0-d tensor): summed
// and divided in fp32.
double mean_f32(const std::vector<double>& x) {
  float sum = 0.0f;
  for (const double v : x) sum += static_cast<float>(v);
  return static_cast<double>(sum / static_cast<float>(x.size()));
}

// olmo_eval's custom_f1_score(labels, preds, pos_label=0).
double f1_score(const std::vector<int64_t>& labels, const std::vector<int64_t>& preds) {
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    tp += labels[i] == 0 && preds[i] == 0;
    fp += labels[i] != 0 && preds[i] == 0;
    fn += labels[i] == 0 && preds[i] != 0;
  }
  if (tp + fp == 0 || tp + fn == 0) return 0.0;
  const double precision = static_cast<double>(tp) / static_cast<double>(tp + fp);
  const double recall = static_cast<double>(tp) / static_cast<double>(tp + fn);
  if (precision + recall == 0.0) return 0.0;
  return 2 * precision * recall / (precision + recall);
}

}  // namespace

std::vector<std::pair<std::string, double>> compute_icl_metrics(
    const data::IclTask& task, const std::vector<IclScore>& scores) {
  MOE_CHECK(scores.size() == task.samples.size(), "[downstream] task {}: {} scores for {} samples",
            task.label, scores.size(), task.samples.size());
  const data::IclMetric metric = task.metric;
  struct Document {
    int64_t label = 0;
    std::map<int64_t, SampleValues> continuations;  // the first value of each cont_id
  };
  std::vector<int64_t> order;  // doc_ids in the order of their first sample
  std::map<int64_t, Document> documents;
  for (size_t i = 0; i < task.samples.size(); ++i) {
    const data::IclSample& s = task.samples[i];
    auto [it, inserted] = documents.try_emplace(s.doc_id);
    if (inserted) {
      order.push_back(s.doc_id);
      it->second.label = s.label_id;
    }
    it->second.continuations.try_emplace(s.cont_id, sample_values(metric, s, scores[i]));
  }

  std::vector<double> correct, celoss, celoss_nls, bpb, bpb_nls, soft, soft_nls, soft_log,
      soft_log_nls;
  std::vector<int64_t> labels, preds, preds_nls;
  for (const int64_t doc_id : order) {
    const Document& doc = documents.at(doc_id);
    const size_t n = doc.continuations.size();
    // A cont_id at or past the count of the document's continuations: olmo_eval skips the
    // document (its IndexError).
    if (doc.continuations.rbegin()->first >= static_cast<int64_t>(n)) continue;
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> ll(n, -inf), ll_nls(n, -inf), ce(n, inf), ce_nls(n, inf), bp(n, inf),
        bp_nls(n, inf);
    for (const auto& [cont_id, v] : doc.continuations) {
      const auto c = static_cast<size_t>(cont_id);
      ll[c] = v.loglikelihood;
      ll_nls[c] = v.loglikelihood_nls;
      ce[c] = v.celoss;
      ce_nls[c] = v.celoss_nls;
      bp[c] = v.bpb;
      bp_nls[c] = v.bpb_nls;
    }
    if (metric == data::IclMetric::kCeLoss) {
      celoss.push_back(static_cast<double>(ce[0]));
      celoss_nls.push_back(static_cast<double>(ce_nls[0]));
      continue;
    }
    if (metric == data::IclMetric::kBpb) {
      bpb.push_back(static_cast<double>(bp[0]));
      bpb_nls.push_back(static_cast<double>(bp_nls[0]));
      continue;
    }
    if (metric == data::IclMetric::kF1) {
      preds.push_back(static_cast<int64_t>(argmax(ll)));
      preds_nls.push_back(static_cast<int64_t>(argmax(ll_nls)));
      labels.push_back(doc.label);
      continue;
    }
    MOE_CHECK(doc.label >= 0 && doc.label < static_cast<int64_t>(n),
              "[downstream] task {}: document {}'s label {} is not among its {} continuations",
              task.label, doc_id, doc.label, n);
    const auto gold = static_cast<size_t>(doc.label);
    correct.push_back(argmax(ll) == gold ? 1.0 : 0.0);
    celoss.push_back(static_cast<double>(ce[gold]));
    celoss_nls.push_back(static_cast<double>(ce_nls[gold]));
    bpb.push_back(static_cast<double>(bp[gold]));
    bpb_nls.push_back(static_cast<double>(bp_nls[gold]));
    soft.push_back(static_cast<double>(softmax_at(ll, gold, false)));
    soft_log.push_back(static_cast<double>(softmax_at(ll, gold, true)));
    soft_nls.push_back(static_cast<double>(softmax_at(ll_nls, gold, false)));
    soft_log_nls.push_back(static_cast<double>(softmax_at(ll_nls, gold, true)));
  }

  const std::string& label = task.label;
  const auto key = [&label](std::string_view what) { return fmt::format("{} ({})", label, what); };
  std::vector<std::pair<std::string, double>> out;
  switch (metric) {
    case data::IclMetric::kF1:
      MOE_CHECK(!labels.empty(), "[downstream] task {}: no document has all its continuations",
                label);
      // As olmo_eval: v1 from the plain log-likelihoods, v2 from those without the leading space.
      out.emplace_back(key("F1 score"), fp32(f1_score(labels, preds)));
      out.emplace_back(key("F1 score v2"), fp32(f1_score(labels, preds_nls)));
      return out;
    case data::IclMetric::kCeLoss:
      out.emplace_back(key("CE loss"), mean_f32(celoss_nls));
      out.emplace_back(key("CE loss v2"), mean_f32(celoss));
      return out;
    case data::IclMetric::kBpb:
      out.emplace_back(key("BPB"), mean_f32(bpb_nls));
      out.emplace_back(key("BPB v2"), mean_f32(bpb));
      return out;
    default:
      break;
  }
  MOE_CHECK(!correct.empty(), "[downstream] task {}: no document has all its continuations", label);
  const std::string accuracy = metric == data::IclMetric::kAcc       ? "accuracy"
                               : metric == data::IclMetric::kLenNorm ? "length-normalized accuracy"
                                                                     : "PMI-DC accuracy";
  // olmo_eval reports the accuracy with the leading space as both v1 and v2.
  out.emplace_back(key(accuracy), mean(correct));
  out.emplace_back(key(accuracy + " v2"), mean(correct));
  out.emplace_back(key("CE loss"), mean(celoss_nls));
  out.emplace_back(key("CE loss v2"), mean(celoss));
  out.emplace_back(key("BPB"), mean(bpb_nls));
  out.emplace_back(key("BPB v2"), mean(bpb));
  out.emplace_back(key("soft loss"), mean(soft_nls));
  out.emplace_back(key("soft loss v2"), mean(soft));
  out.emplace_back(key("log soft loss"), mean(soft_log_nls));
  out.emplace_back(key("log soft loss v2"), mean(soft_log));
  return out;
}

}  // namespace moecore
