#include "train/downstream_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace moecore {

namespace {

// One row to run: a sample's query (or its domain-conditional query), and where its continuation
// is scored.
struct ScoredRow {
  size_t sample;
  bool domain_conditional;
  const std::vector<int32_t>* tokens;
  int64_t first_position;  // the logits row that predicts the continuation's first token
};

// sum_j log softmax(logits[j])[continuation[j]], in double, over the continuation's own rows.
double continuation_logprob(const float* logits, int64_t vocab,
                            const std::vector<int32_t>& continuation) {
  double total = 0.0;
  for (size_t j = 0; j < continuation.size(); ++j) {
    const float* row = logits + static_cast<int64_t>(j) * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    total += static_cast<double>(row[continuation[j]]) - max - std::log(sum);
  }
  return total;
}

}  // namespace

LogitsAt head_logits_at(Transformer& chunk, const ParamBuffers& params) {
  return [&chunk, &params](const int32_t* rows, int64_t count, float* out) {
    chunk.logits_at(params, rows, count, out);
  };
}

std::vector<IclScore> score_icl_task(const data::IclTask& task, const LogitsForward& forward,
                                     int64_t vocab_size, const EvalShare& share, int64_t logit_rows,
                                     int32_t pad_id) {
  MOE_CHECK(share.batch_tokens >= 1, "[downstream] batch of {} tokens", share.batch_tokens);
  MOE_CHECK(logit_rows >= 1, "[downstream] logits of {} rows at a time", logit_rows);
  // fast_mc: the choices scored after each sample's query (its own continuation first).
  std::vector<std::vector<size_t>> choices(task.samples.size());
  std::vector<ScoredRow> rows;
  for (size_t i = 0; i < task.samples.size(); ++i) {
    const data::IclSample& s = task.samples[i];
    if (s.shared_query >= 0) {
      // A choice shares an earlier sample's own query, and reads no more rows than it runs.
      const auto base = static_cast<size_t>(s.shared_query);
      MOE_CHECK(base < i && task.samples[base].shared_query < 0 &&
                    s.continuation.size() <= task.samples[base].continuation.size(),
                "[downstream] sample {} cannot share sample {}'s query", i, s.shared_query);
      choices[base].push_back(i);
      continue;
    }
    choices[i].push_back(i);
    rows.push_back({i, false, &s.query, s.ctx_len - 1});
    if (task.metric == data::IclMetric::kPmiDc)
      rows.push_back({i, true, &s.dc_query, s.dc_len - 1});
  }
  // Longest first (stable: equal lengths keep the file's order), so that a batch pads little;
  // passes of as many rows as batch_tokens holds at the first one's length.
  std::stable_sort(rows.begin(), rows.end(), [](const ScoredRow& a, const ScoredRow& b) {
    return a.tokens->size() > b.tokens->size();
  });
  std::vector<EvalPass> passes;
  std::vector<size_t> pass_begin;  // each pass's first row
  for (size_t begin = 0; begin < rows.size();) {
    const auto seq = static_cast<int64_t>(rows[begin].tokens->size());
    const int64_t fit = std::max<int64_t>(1, share.batch_tokens / seq);
    const size_t end = std::min(rows.size(), begin + static_cast<size_t>(fit));
    passes.push_back({static_cast<int64_t>(end - begin), seq});
    pass_begin.push_back(begin);
    begin = end;
  }

  std::vector<IclScore> scores(task.samples.size());
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;  // a group's scored rows of the pass
  std::vector<float> logits;       // their logits, on the host
  run_eval_passes(passes, share, [&](const EvalForwardShape& f) {
    const size_t first =
        f.pass >= 0 ? pass_begin[static_cast<size_t>(f.pass)] + static_cast<size_t>(f.first_row)
                    : 0;
    tokens.assign(static_cast<size_t>(f.padded_rows * f.seq), pad_id);
    for (int64_t r = 0; r < f.rows; ++r) {
      const std::vector<int32_t>& query = *rows[first + static_cast<size_t>(r)].tokens;
      std::copy(query.begin(), query.end(), tokens.begin() + r * f.seq);
    }
    const LogitsAt logits_at = forward(tokens.data(), f.padded_rows, f.seq);
    if (!logits_at) return;
    // A continuation's rows: those of its sample's own (a fast_mc choice reads the first of them).
    auto scored_rows = [&](int64_t r) {
      return static_cast<int64_t>(
          task.samples[rows[first + static_cast<size_t>(r)].sample].continuation.size());
    };
    for (int64_t begin = 0; begin < f.rows;) {
      // The queries [begin, end) whose continuations fit logit_rows (at least one query).
      positions.clear();
      int64_t end = begin;
      while (end < f.rows &&
             (end == begin ||
              static_cast<int64_t>(positions.size()) + scored_rows(end) <= logit_rows)) {
        const int64_t at = end * f.seq + rows[first + static_cast<size_t>(end)].first_position;
        MOE_CHECK(at + scored_rows(end) <= std::numeric_limits<int32_t>::max(),
                  "[downstream] a pass of {} x {} tokens is too large to index", f.padded_rows,
                  f.seq);
        for (int64_t j = 0; j < scored_rows(end); ++j)
          positions.push_back(static_cast<int32_t>(at + j));
        ++end;
      }
      logits.resize(positions.size() * static_cast<size_t>(vocab_size));
      logits_at(positions.data(), static_cast<int64_t>(positions.size()), logits.data());
      const float* window = logits.data();  // the next query's continuation rows
      for (int64_t r = begin; r < end; ++r) {
        const ScoredRow& row = rows[first + static_cast<size_t>(r)];
        for (size_t choice : choices[row.sample]) {  // its continuation, or fast_mc's choices
          const double logprob =
              continuation_logprob(window, vocab_size, task.samples[choice].continuation);
          (row.domain_conditional ? scores[choice].dc_logprob : scores[choice].logprob) = logprob;
        }
        window += scored_rows(r) * vocab_size;
      }
      begin = end;
    }
  });
  return scores;
}

}  // namespace moecore
