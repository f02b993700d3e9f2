// The planner under train.lm_head_chunk_tokens (model/chunked_lm_head.h): the head keeps no
// logits and no logit gradient, the backward holds one chunk's logits and gradient instead of the
// micro-batch's scaled gradient, the forward one chunk's logits, and the backward's head time
// grows by one forward GEMM of the head.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "plan/activation_model.h"
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
  EXPECT_DOUBLE_EQ(whole.head, 4.0 * (n + n * d + n * v) + 4.0 * layers * e);
  EXPECT_DOUBLE_EQ(chunked.head, 4.0 * (n + n * d) + 4.0 * layers * e);
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
