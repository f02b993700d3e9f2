// The planner under train.lm_head_chunk_tokens (model/chunked_lm_head.h): the head keeps no
// logits and no logit gradient, the backward holds one chunk's logits and gradient instead of the
// micro-batch's scaled gradient, the forward one chunk's logits, and the backward's head time
// grows by one forward GEMM of the head.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "plan/activation_model.h"
#include "plan/layout_search.h"
#include "plan/op_cost.h"
#include "plan/plan.h"
#include "plan_test_config.h"
#include "train/layout_validation.h"

namespace moecore::plan {
namespace {

// small_config with a vocabulary large enough that the head's buffers are the largest scratch.
RunConfig head_config(int64_t chunk_tokens, int64_t microbatches = 2) {
  return small_config({"model.vocab_size=20000",
                       "train.microbatches=" + std::to_string(microbatches),
                       "train.lm_head_chunk_tokens=" + std::to_string(chunk_tokens)});
}

TEST(PlanChunkedHead, TheHeadKeepsNoLogits) {
  // 8 sequences in 2 micro-batches of 4 x 16 tokens, d 32.
  const double n = 4.0 * 16.0, d = 32.0, v = 20000.0, layers = 4.0, e = 8.0;
  const ActivationBytes whole =
      make_plan(head_config(0), 1, kNoRuntime).stages[0].activations_per_microbatch;
  const ActivationBytes chunked =
      make_plan(head_config(16), 1, kNoRuntime).stages[0].activations_per_microbatch;
  // Beside the head's own, the routers' loss terms: lb_score_grad f32, route counts i64 and
  // probability sums f64 per layer and expert, and each layer's z-loss mean.
  const double lb_terms = (4.0 + 16.0) * layers * e + 8.0 * layers;
  EXPECT_DOUBLE_EQ(whole.head, 4.0 * (n + n * d + n * v) + lb_terms);
  EXPECT_DOUBLE_EQ(chunked.head, 4.0 * (n + n * d) + lb_terms);
  EXPECT_DOUBLE_EQ(chunked.residual, whole.residual);
  EXPECT_DOUBLE_EQ(chunked.moe, whole.moe);
}

TEST(PlanChunkedHead, TheBackwardHoldsOneChunk) {
  const double n = 64.0, d = 32.0, v = 20000.0;
  // The head's phase of the backward dominates here: dx and dhidden, then the logits' gradient of
  // the micro-batch, or one chunk's logits and their gradient.
  const Plan whole = make_plan(head_config(0), 1, kNoRuntime);
  const Plan chunked = make_plan(head_config(16), 1, kNoRuntime);
  const Plan whole_one = make_plan(head_config(0, 1), 1, kNoRuntime);
  EXPECT_DOUBLE_EQ(whole.stages[0].pass_scratch, 4.0 * (2.0 * n * d + n * v));
  EXPECT_DOUBLE_EQ(chunked.stages[0].pass_scratch, 4.0 * (2.0 * n * d + 2.0 * 16.0 * v));
  EXPECT_LT(chunked.stages[0].peak, whole.stages[0].peak);
  EXPECT_LT(chunked.stages[0].peak, whole_one.stages[0].peak);
  // A chunk longer than the micro-batch is the micro-batch.
  const Plan longer = make_plan(head_config(1000), 1, kNoRuntime);
  EXPECT_DOUBLE_EQ(longer.stages[0].pass_scratch, 4.0 * (2.0 * n * d + 2.0 * n * v));
}

double lm_head_seconds(const RunConfig& c, bool forward) {
  const ResolvedLayout layout = validate_layout(c, 1);
  const Seconds s = chunk_pass_seconds(c, layout, {0, 4, true, true}, test_rates(), forward);
  return s[static_cast<size_t>(static_cast<int>(TimeCategory::kLmHead))];
}

TEST(PlanChunkedHead, TheBackwardComputesTheLogitsAgain) {
  const RunConfig whole = head_config(0), chunked = head_config(16);
  EXPECT_DOUBLE_EQ(lm_head_seconds(chunked, true), lm_head_seconds(whole, true));
  EXPECT_DOUBLE_EQ(lm_head_seconds(chunked, false),
                   lm_head_seconds(whole, false) + lm_head_seconds(whole, true));
  EXPECT_GT(lm_head_seconds(whole, true), 0.0);
}

TEST(PlanChunkedHead, TheReportNamesTheChunks) {
  const Plan chunked = make_plan(head_config(16), 1, kNoRuntime);
  EXPECT_EQ(plan_json(chunked)["layout"]["lm_head_chunk_tokens"], 16);
  EXPECT_NE(plan_text(chunked).find("recompute=none, LM head in chunks of 16 tokens\n"),
            std::string::npos)
      << plan_text(chunked);
  const Plan whole = make_plan(head_config(0), 1, kNoRuntime);
  EXPECT_EQ(plan_json(whole)["layout"]["lm_head_chunk_tokens"], 0);
  EXPECT_NE(plan_text(whole).find("recompute=none\n"), std::string::npos);
}

TEST(PlanChunkedHead, SuggestedChunksHoldNoMoreThanTheHiddenStates) {
  // ceil(50304 / 2048) = 25 entries per hidden feature: 8192 / 25 -> 328 -> 512.
  EXPECT_EQ(suggested_head_chunk(8192, 50304, 2048), 512);
  // The default run: 2048 / 16 = 128, raised to the 256 rows a GEMM needs to run near its peak.
  EXPECT_EQ(suggested_head_chunk(2048, 4096, 256), 256);
  EXPECT_EQ(suggested_head_chunk(4096, 20000, 32), 256);  // 4096 / 625 -> 8 -> 256
  EXPECT_EQ(suggested_head_chunk(64, 20000, 32), 64);     // the micro-batch, when under 256 rows
  EXPECT_EQ(suggested_head_chunk(1000, 10, 32), 1024);    // a head narrower than the hidden state
}

TEST(PlanChunkedHead, TheSearchTriesTheHeadInChunks) {
  const Hardware hw{"test", 1e12, 0.0, "test", false, test_rates()};
  // One sequence of 2048 tokens per step (one micro-batch: the search varies the rest), in chunks
  // of 256.
  const RunConfig config = small_config({"model.vocab_size=20000", "train.seq_len=2048",
                                         "train.batch_size=1", "train.microbatches=1"});
  const LayoutSearch all = search_layouts(config, 1, hw, 1e15);
  double least_whole = 1e300, least_chunked = 1e300;
  for (const LayoutChoice& l : all.fits) {
    // The head whole, or in the suggested chunks of this layout's micro-batch rows.
    const int64_t rows = validate_layout(with_layout(config, l), 1).local_rows * 2048;
    EXPECT_TRUE(l.lm_head_chunk_tokens == 0 ||
                l.lm_head_chunk_tokens == suggested_head_chunk(rows, 20000, 32));
    double& least = l.lm_head_chunk_tokens == 0 ? least_whole : least_chunked;
    least = std::min(least, l.peak_bytes);
  }
  ASSERT_LT(least_chunked, least_whole);
  // A budget only chunked heads fit.
  const LayoutSearch tight = search_layouts(config, 1, hw, 0.5 * (least_chunked + least_whole));
  ASSERT_FALSE(tight.fits.empty());
  for (const LayoutChoice& l : tight.fits) EXPECT_GT(l.lm_head_chunk_tokens, 0);
  // A config that chunks its head keeps its chunk.
  for (const LayoutChoice& l : search_layouts(head_config(16), 1, hw, 1e15).fits)
    EXPECT_EQ(l.lm_head_chunk_tokens, 16);
}

TEST(PlanChunkedHead, ANegativeChunkIsAConfigError) {
  try {
    (void)head_config(-1);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.lm_head_chunk_tokens=-1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moecore::plan
