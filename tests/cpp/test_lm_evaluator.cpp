// The labelled sets of OLMo-core's LM evaluator (data/padded_documents.h) and the scorer's
// bookkeeping (train/lm_evaluator.h). The values against OLMo-core itself (its padded dataset,
// loader and LMEvaluator) are in tests/train/test_lm_evaluator.py; these tests pin the rules one
// by one and the batching on a forward that records what it is given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/ignore_index.h"
#include "data/padded_documents.h"
#include "scratch_dir.h"
#include "train/eval_passes.h"
#include "train/lm_evaluator.h"

namespace moecore {
namespace {

using data::LmEvalSet;
using data::PaddedDocuments;

constexpr int32_t kEos = 1;
constexpr int64_t kVocab = 100;

// A forward that records each pass and returns a loss of 1 per target (so the sum is the count).
struct RecordingForward {
  struct Pass {
    std::vector<int32_t> tokens, targets;
    int64_t rows, seq;
  };
  std::vector<Pass> passes;
  EvalForward fn() {
    return [this](const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t seq) {
      const size_t n = static_cast<size_t>(rows * seq);
      passes.push_back({{tokens, tokens + n}, {targets, targets + n}, rows, seq});
      LossParts parts;
      parts.counted_tokens =
          std::count_if(targets, targets + n, [](int32_t t) { return t != kIgnoreIndex; });
      parts.ce = parts.counted_tokens > 0 ? 1.0 : 0.0;
      return parts;
    };
  }
};

class PaddedDocumentsTest : public ::testing::Test {
 protected:
  // A headerless uint16 file (OLMo-core's layout), declared by the caller's dtype.
  std::string raw(const std::string& name, const std::vector<uint16_t>& values) const {
    const std::string path = (dir_.path() / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(uint16_t)));
    return path;
  }
  static std::vector<int32_t> document(const PaddedDocuments& docs, int64_t i) {
    std::vector<int32_t> tokens(static_cast<size_t>(docs.length(i)));
    std::vector<uint8_t> mask(tokens.size(), 7);
    docs.read(i, tokens.data(), mask.data());
    EXPECT_EQ(mask, std::vector<uint8_t>(tokens.size(), 1));  // no masks: every position
    return tokens;
  }
  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  ScratchDir dir_{"padded_documents"};
};

TEST_F(PaddedDocumentsTest, DocumentsEndAtEachEosAreCutToTheSequenceAndTheTailIsNone) {
  // Set a: a document longer than seq_len 4, a one-token document (EOS after EOS), a short one,
  // then a tail without an EOS. Set b: two files, in the order given.
  const std::string a = raw("a.npy", {5, 6, 7, 8, 9, kEos, kEos, 10, kEos, 11, 12});
  const std::string b1 = raw("b1.npy", {20, kEos});
  const std::string b2 = raw("b2.npy", {21, 22, kEos, 23, kEos});
  const PaddedDocuments docs =
      PaddedDocuments::open({{"a", {a}, {}}, {"b", {b1, b2}, {}}}, 4, kVocab, "uint16", kEos);
  ASSERT_EQ(docs.num_documents(), 6);
  EXPECT_EQ(docs.labels(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(document(docs, 0), (std::vector<int32_t>{5, 6, 7, 8}));  // cut at seq_len
  EXPECT_EQ(document(docs, 1), (std::vector<int32_t>{kEos}));
  EXPECT_EQ(document(docs, 2), (std::vector<int32_t>{10, kEos}));
  EXPECT_EQ(document(docs, 3), (std::vector<int32_t>{20, kEos}));
  EXPECT_EQ(document(docs, 4), (std::vector<int32_t>{21, 22, kEos}));
  EXPECT_EQ(document(docs, 5), (std::vector<int32_t>{23, kEos}));
  const std::vector<int> labels = {0, 0, 0, 1, 1, 1};
  for (int64_t i = 0; i < docs.num_documents(); ++i)
    EXPECT_EQ(docs.label_index(i), labels[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(docs.eos_id(), kEos);
}

TEST_F(PaddedDocumentsTest, ALabelGivenAgainGathersItsSetsInTheOrderGiven) {
  // OLMo-core's metadata may label paths A, B, A: documents numbered in path order, two labels.
  const std::string a1 = raw("a1.npy", {5, kEos});
  const std::string b = raw("b.npy", {6, kEos, 7, kEos});
  const std::string a2 = raw("a2.npy", {8, 9, kEos});
  const PaddedDocuments docs = PaddedDocuments::open(
      {{"a", {a1}, {}}, {"b", {b}, {}}, {"a", {a2}, {}}}, 4, kVocab, "uint16", kEos);
  EXPECT_EQ(docs.labels(), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(docs.num_documents(), 4);
  EXPECT_EQ(docs.label_index(0), 0);
  EXPECT_EQ(docs.label_index(1), 1);
  EXPECT_EQ(docs.label_index(2), 1);
  EXPECT_EQ(docs.label_index(3), 0);
  EXPECT_EQ(document(docs, 3), (std::vector<int32_t>{8, 9, kEos}));
}

TEST_F(PaddedDocumentsTest, BadSetsAreOneLineErrors) {
  const std::string ok = raw("ok.npy", {5, kEos});
  const std::string none = raw("none.npy", {5, 6, 7});
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"x", {none}, {}}}, 4, kVocab, "uint16", kEos);
            }).find("set 'x': no document in"),
            std::string::npos);
  // OLMo-core refuses each file without a document, also beside one with documents.
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"x", {ok, none}, {}}}, 4, kVocab, "uint16", kEos);
            }).find("set 'x': no document in " + none),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"", {ok}, {}}}, 4, kVocab, "uint16", kEos);
            }).find("has no label"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"x", {}, {}}}, 4, kVocab, "uint16", kEos);
            }).find("lists no token files"),
            std::string::npos);
  // No EOS given and no meta.json to say it.
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"x", {ok}, {}}}, 4, kVocab, "uint16", -1);
            }).find("documents end at an EOS"),
            std::string::npos);
  // An id outside the vocabulary, found when the set is scanned.
  const std::string big = raw("big.npy", {5, 300, kEos});
  EXPECT_NE(error_of([&] {
              PaddedDocuments::open({{"x", {big}, {}}}, 4, kVocab, "uint16", kEos);
            }).find("token id 300"),
            std::string::npos);
}

TEST_F(PaddedDocumentsTest, LabelMasksCountTheirPositionsAndTheirTargets) {
  // Documents {5, 6, 7, EOS} and {8, 9, EOS}; masks 1 0 1 1 | 1 1 0.
  const std::string a = raw("a.npy", {5, 6, 7, kEos, 8, 9, kEos});
  const std::string a_mask = (dir_.path() / "a_mask.npy").string();
  {
    std::ofstream out(a_mask, std::ios::binary);
    const uint8_t bytes[] = {1, 0, 1, 1, 1, 1, 0};
    out.write(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  }
  const PaddedDocuments docs =
      PaddedDocuments::open({{"a", {a}, {a_mask}}}, 8, kVocab, "uint16", kEos);
  ASSERT_EQ(docs.num_documents(), 2);
  std::vector<int32_t> tokens(4);
  std::vector<uint8_t> mask(4);
  docs.read(1, tokens.data(), mask.data());
  EXPECT_EQ(std::vector<uint8_t>(mask.begin(), mask.begin() + 3), (std::vector<uint8_t>{1, 1, 0}));
  RecordingForward recorder;
  const LmEvalSums sums = score_lm_documents(docs, {0, 1}, recorder.fn(), {.batch_tokens = 64}, 0);
  // Positions: the mask's ones (3 + 2). Targets: positions whose token and next token are labels:
  // 7 -> EOS in the first; 8 -> 9 in the second (9's next, the EOS, is masked).
  EXPECT_EQ(sums.positions, (std::vector<double>{5}));
  EXPECT_EQ(sums.loss, (std::vector<double>{2}));
  ASSERT_EQ(recorder.passes.size(), 1u);
  EXPECT_EQ(recorder.passes[0].targets,
            (std::vector<int32_t>{kIgnoreIndex, kIgnoreIndex, kEos, kIgnoreIndex, 9, kIgnoreIndex,
                                  kIgnoreIndex, kIgnoreIndex}));
}

// train/eval_passes.h: every row of every pass runs once over the shards; in lockstep every
// shard makes the same forwards' shapes, none over the batch's tokens (or one row).
TEST(EvalPassesTest, SpreadAndLockstepRunEveryRowOnce) {
  const std::vector<EvalPass> passes = {{2, 40}, {3, 30}, {9, 10}, {1, 90}, {4, 20}};
  const int64_t batch_tokens = 90;
  for (const bool lockstep : {false, true}) {
    for (const int64_t shards : {1, 2, 3}) {
      std::vector<int64_t> seen(passes.size(), 0);
      std::vector<std::vector<std::pair<int64_t, int64_t>>> shapes(static_cast<size_t>(shards));
      for (int64_t shard = 0; shard < shards; ++shard) {
        run_eval_passes(passes, {batch_tokens, shard, shards, lockstep},
                        [&](const EvalForwardShape& f) {
                          shapes[static_cast<size_t>(shard)].push_back({f.padded_rows, f.seq});
                          EXPECT_LE(f.rows, f.padded_rows);
                          EXPECT_TRUE(f.padded_rows * f.seq <= batch_tokens || f.padded_rows == 1);
                          if (f.pass < 0) return;
                          const EvalPass& p = passes[static_cast<size_t>(f.pass)];
                          EXPECT_EQ(f.first_row, seen[static_cast<size_t>(f.pass)]);
                          EXPECT_GE(f.seq, p.seq);
                          seen[static_cast<size_t>(f.pass)] += f.rows;
                        });
      }
      for (size_t p = 0; p < passes.size(); ++p)
        EXPECT_EQ(seen[p], passes[p].rows) << "pass " << p << " shards " << shards;
      if (lockstep) {
        for (const auto& s : shapes) EXPECT_EQ(s, shapes[0]) << shards;
      }
    }
  }
}

TEST(LmEvalDocumentsTest, WholeBatchesOfTheLoadersShuffleThenTheFirstBatches) {
  const std::vector<int64_t> all = lm_eval_documents(23, 4, 0);
  ASSERT_EQ(all.size(), 20u);  // 5 whole batches of 4; 3 documents fill none
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 20u);
  // The same permutation OLMo-core's loader reads at epoch 1 with seed 0 (InstanceOrder's rule,
  // held against NumPy in test_olmo_core_data_order.py).
  EXPECT_EQ(all,
            data::InstanceOrder::with_rule(data::OrderRule::kOlmoCore, 0, 23, 4).permutation(0));
  const std::vector<int64_t> two = lm_eval_documents(23, 4, 2);
  EXPECT_EQ(two, std::vector<int64_t>(all.begin(), all.begin() + 8));
  EXPECT_EQ(lm_eval_documents(23, 4, 9), all);  // more batches than there are: the epoch
  // Batches x documents beyond an int64: still the epoch (compared in batches).
  EXPECT_EQ(lm_eval_documents(23, 4, std::numeric_limits<int64_t>::max()), all);
  EXPECT_EQ(lm_eval_documents(23, 4, int64_t{1} << 62), all);
  EXPECT_THROW(lm_eval_documents(3, 4, 0), Error);
}

TEST_F(PaddedDocumentsTest, PassesHoldOneLabelLongestFirstAndCountEveryPosition) {
  const std::string a = raw("a.npy", {5, 6, kEos, 7, kEos, 8, 9, 10, kEos, kEos});
  const std::string b = raw("b.npy", {11, 12, 13, 14, 15, kEos, 16, kEos});
  const PaddedDocuments docs =
      PaddedDocuments::open({{"a", {a}, {}}, {"b", {b}, {}}}, 4, kVocab, "uint16", kEos);
  ASSERT_EQ(docs.num_documents(), 6);  // a: 3, 2, 4, 1 tokens; b: 4 (cut), 2
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  RecordingForward recorder;
  const LmEvalSums sums = score_lm_documents(docs, all, recorder.fn(), {.batch_tokens = 8}, 0);
  // Positions: each document's length; losses: its targets (length - 1), 1 each.
  EXPECT_EQ(sums.positions, (std::vector<double>{3 + 2 + 4 + 1, 4 + 2}));
  EXPECT_EQ(sums.loss, (std::vector<double>{2 + 1 + 3 + 0, 3 + 1}));
  EXPECT_EQ(sums.documents, (std::vector<int64_t>{4, 2}));
  // a's passes: [4, 3] (8 tokens at seq 4), then [2, 1] at seq 2; b's: [4, 2] at seq 4.
  ASSERT_EQ(recorder.passes.size(), 3u);
  EXPECT_EQ(recorder.passes[0].rows, 2);
  EXPECT_EQ(recorder.passes[0].seq, 4);
  EXPECT_EQ(recorder.passes[0].tokens, (std::vector<int32_t>{8, 9, 10, kEos, 5, 6, kEos, 0}));
  EXPECT_EQ(recorder.passes[0].targets,
            (std::vector<int32_t>{9, 10, kEos, kIgnoreIndex, 6, kEos, kIgnoreIndex, kIgnoreIndex}));
  EXPECT_EQ(recorder.passes[1].rows, 2);
  EXPECT_EQ(recorder.passes[1].seq, 2);
  EXPECT_EQ(recorder.passes[2].tokens, (std::vector<int32_t>{11, 12, 13, 14, 16, kEos, 0, 0}));
  const io::MetricsSink::Scalars metrics = lm_eval_metrics(docs, sums, "eval/lm/");
  ASSERT_EQ(metrics.size(), 4u);
  EXPECT_EQ(metrics[0].first, "eval/lm/a/CE loss");
  EXPECT_DOUBLE_EQ(metrics[0].second, 6.0 / 10.0);
  EXPECT_EQ(metrics[3].first, "eval/lm/b/PPL");
  EXPECT_DOUBLE_EQ(metrics[3].second, std::exp(4.0 / 6.0));

  // Shards: each runs every shards-th pass; their losses sum to the whole, positions are whole.
  std::vector<double> summed(2, 0.0);
  size_t passes = 0;
  for (int64_t shard = 0; shard < 2; ++shard) {
    RecordingForward part;
    const LmEvalSums s = score_lm_documents(docs, all, part.fn(), {8, shard, 2, false}, 0);
    EXPECT_EQ(s.positions, sums.positions);
    for (size_t i = 0; i < 2; ++i) summed[i] += s.loss[i];
    passes += part.passes.size();
  }
  EXPECT_EQ(summed, sums.loss);
  EXPECT_EQ(passes, 3u);
  // In lockstep (expert parallelism) every shard makes the same forwards, of the same shapes;
  // the losses still sum to the whole.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> shapes(3);
  summed.assign(2, 0.0);
  for (int64_t shard = 0; shard < 3; ++shard) {
    RecordingForward part;
    const LmEvalSums s = score_lm_documents(docs, all, part.fn(), {8, shard, 3, true}, 0);
    for (size_t i = 0; i < 2; ++i) summed[i] += s.loss[i];
    for (const auto& p : part.passes) shapes[static_cast<size_t>(shard)].push_back({p.rows, p.seq});
  }
  EXPECT_EQ(summed, sums.loss);
  EXPECT_EQ(shapes[0], shapes[1]);
  EXPECT_EQ(shapes[0], shapes[2]);
  // A label without a scored document is left out of the metrics.
  const LmEvalSums only_b = score_lm_documents(docs, {4, 5}, recorder.fn(), {.batch_tokens = 8}, 0);
  const io::MetricsSink::Scalars b_metrics = lm_eval_metrics(docs, only_b, "");
  ASSERT_EQ(b_metrics.size(), 2u);
  EXPECT_EQ(b_metrics[0].first, "b/CE loss");
}

}  // namespace
}  // namespace moecore
