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
                              const EvalShare& share, int32_t pad_id) {
  MOE_CHECK(share.batch_tokens >= 1, "[lm_eval] batch of {} tokens", share.batch_tokens);
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
  // The passes: as many of a label's documents as batch_tokens holds at the first one's length.
  std::vector<EvalPass> passes;
  std::vector<size_t> pass_begin;  // each pass's first row
  for (size_t begin = 0; begin < rows.size();) {
    const int label = docs.label_index(rows[begin]);
    const int64_t seq = docs.length(rows[begin]);
    const int64_t fit = std::max<int64_t>(1, share.batch_tokens / seq);
    size_t end = begin;
    while (end < rows.size() && end - begin < static_cast<size_t>(fit) &&
           docs.label_index(rows[end]) == label)
      ++end;
    passes.push_back({static_cast<int64_t>(end - begin), seq});
    pass_begin.push_back(begin);
    begin = end;
  }

  // Every process counts every document's positions (the losses are summed over the shards).
  for (int64_t doc : rows) {
    const auto label = static_cast<size_t>(docs.label_index(doc));
    sums.positions[label] += static_cast<double>(docs.labelled(doc));
    ++sums.documents[label];
  }
  std::vector<int32_t> tokens, targets;
  std::vector<uint8_t> mask(static_cast<size_t>(docs.seq_len()));
  // A document's tokens at row `offset` and its targets: a position's next token where both are
  // labels (the last position's target lies in the padding).
  auto place = [&](int64_t doc, int64_t offset) {
    const int64_t length = docs.length(doc);
    docs.read(doc, tokens.data() + offset, mask.data());
    for (int64_t t = 0; t + 1 < length; ++t)
      if (mask[static_cast<size_t>(t)] != 0 && mask[static_cast<size_t>(t + 1)] != 0)
        targets[static_cast<size_t>(offset + t)] = tokens[static_cast<size_t>(offset + t + 1)];
  };
  run_eval_passes(passes, share, [&](const EvalForwardShape& f) {
    tokens.assign(static_cast<size_t>(f.padded_rows * f.seq), pad_id);
    targets.assign(static_cast<size_t>(f.padded_rows * f.seq), kIgnoreIndex);
    if (f.pass >= 0) {
      const size_t first =
          pass_begin[static_cast<size_t>(f.pass)] + static_cast<size_t>(f.first_row);
      for (int64_t r = 0; r < f.rows; ++r) place(rows[first + static_cast<size_t>(r)], r * f.seq);
    }
    // (A forward without a target, padding alone or one-token documents, counts nothing.)
    const LossParts loss = forward(tokens.data(), targets.data(), f.padded_rows, f.seq);
    if (f.pass >= 0) {
      const auto label =
          static_cast<size_t>(docs.label_index(rows[pass_begin[static_cast<size_t>(f.pass)]]));
      sums.loss[label] += loss.ce * static_cast<double>(loss.counted_tokens);
    }
  });
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
