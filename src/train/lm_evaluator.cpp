#include "train/lm_evaluator.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/ignore_index.h"
#include "data/instance_order.h"

namespace moecore {

int64_t lm_eval_batch_documents(const RunConfig& config) {
  return config.train.batch_size / config.train.microbatches;
}

std::vector<int64_t> lm_eval_documents(int64_t num_documents, int64_t batch_instances,
                                       int64_t max_batches) {
  MOE_CHECK(batch_instances >= 1, "[lm_eval] an evaluation batch of {} documents", batch_instances);
  MOE_CHECK(max_batches >= 0, "[lm_eval] max_batches={} must be >= 0", max_batches);
  MOE_CHECK(num_documents >= batch_instances,
            "[lm_eval] the labelled sets hold {} documents, fewer than one evaluation batch of {} "
            "(the training micro-batch's rows): OLMo-core's loader would score none",
            num_documents, batch_instances);
  // The loader's seed 0 at epoch 1: the permutation InstanceOrder's OLMo-core rule gives its first
  // epoch (seed + 0 + 1), whole batches only.
  std::vector<int64_t> order =
      data::InstanceOrder::with_rule(data::OrderRule::kOlmoCore, 0, num_documents, batch_instances)
          .permutation(0);
  // (Compared in batches: max_batches x batch_instances may not fit an int64.)
  const auto batches = static_cast<int64_t>(order.size()) / batch_instances;
  if (max_batches > 0 && max_batches < batches)
    order.resize(static_cast<size_t>(max_batches * batch_instances));
  return order;
}

LmEvalSums score_lm_documents(const data::PaddedDocuments& docs,
                              const std::vector<int64_t>& documents, const EvalForward& forward,
                              int64_t batch_tokens, int32_t pad_id, int64_t shard, int64_t shards) {
  MOE_CHECK(batch_tokens >= 1, "[lm_eval] batch of {} tokens", batch_tokens);
  MOE_CHECK(shards >= 1 && shard >= 0 && shard < shards, "[lm_eval] shard {} of {}", shard, shards);
  const size_t labels = docs.labels().size();
  LmEvalSums sums{std::vector<double>(labels, 0.0), std::vector<double>(labels, 0.0),
                  std::vector<int64_t>(labels, 0)};
  // By label (in order), longest first within it (stable: equal lengths keep the visiting
  // order), so that a pass is one label's and pads little.
  std::vector<int64_t> rows = documents;
  std::stable_sort(rows.begin(), rows.end(), [&docs](int64_t a, int64_t b) {
    if (docs.label_index(a) != docs.label_index(b))
      return docs.label_index(a) < docs.label_index(b);
    return docs.length(a) > docs.length(b);
  });
  std::vector<int32_t> tokens, targets;
  std::vector<uint8_t> mask(static_cast<size_t>(docs.seq_len()));
  int64_t pass = 0;
  for (size_t begin = 0; begin < rows.size(); ++pass) {
    const int label = docs.label_index(rows[begin]);
    const int64_t seq = docs.length(rows[begin]);
    const int64_t fit = std::max<int64_t>(1, batch_tokens / seq);
    size_t end = begin;
    while (end < rows.size() && end - begin < static_cast<size_t>(fit) &&
           docs.label_index(rows[end]) == label)
      ++end;
    const size_t first = begin;
    begin = end;
    // Every process reads every pass (the positions are counted on all); its share it runs.
    const auto count = static_cast<int64_t>(end - first);
    tokens.assign(static_cast<size_t>(count * seq), pad_id);
    targets.assign(static_cast<size_t>(count * seq), kIgnoreIndex);
    int64_t counted = 0;
    for (size_t r = first; r < end; ++r) {
      const int64_t length = docs.length(rows[r]);
      const int64_t offset = static_cast<int64_t>(r - first) * seq;
      docs.read(rows[r], tokens.data() + offset, mask.data());
      // A position counts where its mask is 1; its loss is its next token's within the document
      // where that token's mask is 1 too (the last position's lies in the padding).
      for (int64_t t = 0; t < length; ++t) {
        if (mask[static_cast<size_t>(t)] == 0) continue;
        sums.positions[static_cast<size_t>(label)] += 1.0;
        if (t + 1 < length && mask[static_cast<size_t>(t + 1)] != 0) {
          targets[static_cast<size_t>(offset + t)] = tokens[static_cast<size_t>(offset + t + 1)];
          ++counted;
        }
      }
      ++sums.documents[static_cast<size_t>(label)];
    }
    // A pass without a target (one-token documents, masks) has no loss: nothing to run (every
    // process skips it alike).
    if (pass % shards != shard || counted == 0) continue;
    const LossParts loss = forward(tokens.data(), targets.data(), count, seq);
    sums.loss[static_cast<size_t>(label)] += loss.ce * static_cast<double>(loss.counted_tokens);
  }
  return sums;
}

io::MetricsSink::Scalars lm_eval_metrics(const data::PaddedDocuments& docs, const LmEvalSums& sums,
                                         const std::string& prefix) {
  io::MetricsSink::Scalars metrics;
  for (size_t i = 0; i < docs.labels().size(); ++i) {
    if (sums.positions[i] == 0.0) continue;
    const double ce = sums.loss[i] / sums.positions[i];
    metrics.emplace_back(prefix + docs.labels()[i] + "/CE loss", ce);
    metrics.emplace_back(prefix + docs.labels()[i] + "/PPL", std::exp(ce));
  }
  return metrics;
}

}  // namespace moecore
