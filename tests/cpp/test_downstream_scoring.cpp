// The downstream scorer's reading of logits (train/downstream_eval.h): which rows of each pass it
// asks the head for, in groups of at most logit_rows, and which of them each score is summed from.
// The values against olmo_eval and transformers are in tests/train/test_downstream_eval.py; here a
// forward whose logits are a causal function of the query (a row's logits depend only on the
// tokens up to it) shows that every score is the one of its query alone, whatever the grouping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "data/icl_task.h"
#include "train/downstream_eval.h"
#include "train/eval_passes.h"

namespace moecore {
namespace downstream_scoring_test {
namespace {

constexpr int64_t kVocab = 7;

// The logits of the row after `prefix` (a query's tokens up to and including the row's).
std::vector<float> causal_logits(const int32_t* prefix, int64_t length) {
  uint64_t h = 1469598103934665603ULL;
  for (int64_t i = 0; i < length; ++i)
    h = (h ^ static_cast<uint64_t>(prefix[i] + 1)) * 1099511628211ULL;
  std::vector<float> row(kVocab);
  for (int64_t v = 0; v < kVocab; ++v)
    row[static_cast<size_t>(v)] = static_cast<float>(
        std::sin(static_cast<double>(h % 9973) + 1.7 * static_cast<double>(v)) * 3.0);
  return row;
}

// sum_j log softmax(row ctx_len - 1 + j of `query`)[continuation[j]], in double.
double reference_logprob(const std::vector<int32_t>& query, int64_t ctx_len,
                         const std::vector<int32_t>& continuation) {
  double total = 0.0;
  for (size_t j = 0; j < continuation.size(); ++j) {
    const std::vector<float> row = causal_logits(query.data(), ctx_len + static_cast<int64_t>(j));
    const double max = *std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (float x : row) sum += std::exp(static_cast<double>(x) - max);
    total += static_cast<double>(row[static_cast<size_t>(continuation[j])]) - max - std::log(sum);
  }
  return total;
}

// A forward of causal_logits that records every reader call's rows.
struct CausalForward {
  std::vector<std::vector<int32_t>> calls;  // each reader call's rows
  int64_t passes = 0;
  LogitsForward fn() {
    return [this](const int32_t* tokens, int64_t rows, int64_t seq) -> LogitsAt {
      ++passes;
      std::vector<int32_t> held(tokens, tokens + rows * seq);
      return [this, held, rows, seq](const int32_t* at, int64_t count, float* out) {
        calls.emplace_back(at, at + count);
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_GE(at[i], 0);
          ASSERT_LT(at[i], rows * seq);
          const int64_t row = at[i] / seq, position = at[i] % seq;
          const std::vector<float> logits = causal_logits(held.data() + row * seq, position + 1);
          std::copy(logits.begin(), logits.end(), out + i * kVocab);
        }
      };
    };
  }
};

data::IclSample sample(std::vector<int32_t> context, std::vector<int32_t> continuation) {
  data::IclSample s;
  s.query = context;
  s.query.insert(s.query.end(), continuation.begin(), continuation.end() - 1);
  s.ctx_len = static_cast<int64_t>(context.size());
  s.dc_query = {6};
  s.dc_query.insert(s.dc_query.end(), continuation.begin(), continuation.end() - 1);
  s.dc_len = 1;
  s.continuation = std::move(continuation);
  return s;
}

// Queries of 3 to 9 tokens, continuations of 1 to 4 (so that groups of 1 to 5 rows cut them in
// every way), as pmi_dc (the domain-conditional queries run too).
data::IclTask pmi_task() {
  data::IclTask task;
  task.metric = data::IclMetric::kPmiDc;
  task.samples = {sample({1, 2, 3}, {4}),          sample({5, 1, 1, 2}, {3, 3, 0}),
                  sample({2, 2}, {1, 0, 5, 4}),    sample({4, 4, 4, 4, 4}, {2, 1}),
                  sample({0, 1, 2, 3, 4, 5}, {6}), sample({3}, {1, 2, 3, 4})};
  task.documents = 6;
  return task;
}

int64_t continuation_rows(const data::IclTask& task) {
  int64_t rows = 0;
  for (const data::IclSample& s : task.samples)
    if (s.shared_query < 0) rows += 2 * static_cast<int64_t>(s.continuation.size());  // and dc
  return rows;
}

TEST(DownstreamScoring, EachScoreIsItsQueryAlonesInGroupsOfAtMostLogitRows) {
  const data::IclTask task = pmi_task();
  std::vector<IclScore> first;
  for (const int64_t batch_tokens : {9, 20, 1000}) {
    for (const int64_t logit_rows : {1, 2, 3, 5, 1000}) {
      SCOPED_TRACE(testing::Message()
                   << "batch_tokens " << batch_tokens << " logit_rows " << logit_rows);
      CausalForward forward;
      const std::vector<IclScore> scores =
          score_icl_task(task, forward.fn(), kVocab, EvalShare{.batch_tokens = batch_tokens},
                         logit_rows, /*pad_id=*/0);
      ASSERT_EQ(scores.size(), task.samples.size());
      for (size_t i = 0; i < task.samples.size(); ++i) {
        const data::IclSample& s = task.samples[i];
        EXPECT_NEAR(scores[i].logprob, reference_logprob(s.query, s.ctx_len, s.continuation), 1e-12)
            << i;
        EXPECT_NEAR(scores[i].dc_logprob, reference_logprob(s.dc_query, s.dc_len, s.continuation),
                    1e-12)
            << i;
      }
      // The same scores to the bit however the rows are grouped.
      if (first.empty()) first = scores;
      for (size_t i = 0; i < scores.size(); ++i) {
        EXPECT_EQ(scores[i].logprob, first[i].logprob) << i;
        EXPECT_EQ(scores[i].dc_logprob, first[i].dc_logprob) << i;
      }
      // Only the continuations' rows are computed, each once, in groups of at most logit_rows
      // (a longer continuation alone).
      int64_t asked = 0;
      for (const std::vector<int32_t>& rows : forward.calls) {
        asked += static_cast<int64_t>(rows.size());
        EXPECT_TRUE(static_cast<int64_t>(rows.size()) <= logit_rows || rows.size() <= 4)
            << rows.size();
        EXPECT_FALSE(rows.empty());
      }
      EXPECT_EQ(asked, continuation_rows(task));
      if (logit_rows >= 1000) {  // one group a pass
        EXPECT_EQ(static_cast<int64_t>(forward.calls.size()), forward.passes);
      }
    }
  }
}

// fast_mc (one query a document, each choice read from its first continuation's row): a choice's
// score is its token's log-probability at the query's row, the group holding that row.
TEST(DownstreamScoring, FastMultipleChoiceReadsTheChoicesFromTheirQuerysRow) {
  data::IclTask task;
  task.metric = data::IclMetric::kAcc;
  task.fast_mc = true;
  task.samples = {sample({1, 2, 3}, {4}), sample({1, 2, 3}, {5}), sample({1, 2, 3}, {0}),
                  sample({6, 5}, {2}), sample({6, 5}, {3})};
  task.samples[1].shared_query = task.samples[2].shared_query = 0;
  task.samples[4].shared_query = 3;
  task.documents = 2;
  for (const int64_t logit_rows : {1, 2, 1000}) {
    CausalForward forward;
    const std::vector<IclScore> scores = score_icl_task(
        task, forward.fn(), kVocab, EvalShare{.batch_tokens = 100}, logit_rows, /*pad_id=*/0);
    for (size_t i = 0; i < task.samples.size(); ++i) {
      const data::IclSample& s = task.samples[i];
      EXPECT_NEAR(scores[i].logprob, reference_logprob(s.query, s.ctx_len, s.continuation), 1e-12)
          << "logit_rows " << logit_rows << " sample " << i;
    }
    int64_t asked = 0;
    for (const std::vector<int32_t>& rows : forward.calls)
      asked += static_cast<int64_t>(rows.size());
    EXPECT_EQ(asked, 2) << logit_rows;  // one row a document
  }
}

TEST(DownstreamScoring, NoRowsAtATimeIsAnError) {
  CausalForward forward;
  EXPECT_THROW((void)score_icl_task(pmi_task(), forward.fn(), kVocab,
                                    EvalShare{.batch_tokens = 100}, 0, /*pad_id=*/0),
               Error);
}

}  // namespace
}  // namespace downstream_scoring_test
}  // namespace moecore
