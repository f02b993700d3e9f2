// The planner under train.recompute: activation bytes per micro-batch against a hand count of what
// Transformer::release_recomputed keeps, the rebuilt block on top of the backward's scratch, and
// the backward's step time growing by exactly the recomputed sublayers' forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "plan/activation_model.h"
#include "plan/op_cost.h"
#include "plan/plan.h"
#include "plan_test_config.h"
#include "train/layout_validation.h"

namespace moecore::plan {
namespace {

ActivationBytes activations(const std::string& mode) {
  return make_plan(small_config({"train.recompute=\"" + mode + "\""}), 1, kNoRuntime)
      .stages[0]
      .activations_per_microbatch;
}

TEST(PlanRecompute, ActivationsKeepWhatTheModelKeeps) {
  // small_config: 4 sequences x 16 tokens per micro-batch, d 32, 8 experts top-2, 4 layers (the
  // first dense), 3 of them MoE.
  const double n = 4.0 * 16.0, d = 32.0, e = 8.0, k = 2.0, layers = 4.0, moe_layers = 3.0;
  const double router_state = 4.0 * (2.0 * n * e + 2.0 * n * k) + 8.0 * e;  // per MoE layer
  const ActivationBytes none = activations("none"), full = activations("full"),
                        attention = activations("attention"), moe = activations("moe");
  // full: the block inputs (residual), the router states and the head; nothing else.
  EXPECT_DOUBLE_EQ(full.residual, none.residual);
  EXPECT_DOUBLE_EQ(full.head, none.head);
  EXPECT_DOUBLE_EQ(full.norms, 0.0);
  EXPECT_DOUBLE_EQ(full.attention, 0.0);
  EXPECT_DOUBLE_EQ(full.dense_mlp, 0.0);
  EXPECT_DOUBLE_EQ(full.moe, moe_layers * router_state);
  // attention: its caches and rstd1, h1 go; mid and the FFN side stay.
  EXPECT_DOUBLE_EQ(attention.attention, 0.0);
  EXPECT_DOUBLE_EQ(attention.norms, none.norms - layers * 4.0 * (n + n * d));
  EXPECT_DOUBLE_EQ(attention.moe, none.moe);
  EXPECT_DOUBLE_EQ(attention.dense_mlp, none.dense_mlp);
  // moe: the FFN side (rstd2, h2, dense MLP, MoE but its router) goes; attention stays.
  EXPECT_DOUBLE_EQ(moe.attention, none.attention);
  EXPECT_DOUBLE_EQ(moe.norms, none.norms - layers * 4.0 * (n + n * d));
  EXPECT_DOUBLE_EQ(moe.dense_mlp, 0.0);
  EXPECT_DOUBLE_EQ(moe.moe, moe_layers * router_state);
  EXPECT_LT(full.total(), moe.total());
  EXPECT_LT(full.total(), attention.total());
}

// The rebuilt layers live in their own buffers, kept all run outside the workspace: each part at
// its largest over the layers, so a chunk with a dense and MoE layers keeps both MLP kinds (more
// than its largest single layer rebuilds).
TEST(PlanRecompute, RebuiltLayersKeepTheirBuffersBesideTheWorkspace) {
  const RunConfig none = small_config(), full = small_config({"train.recompute=\"full\""});
  const Plan a = make_plan(none, 1, kNoRuntime), b = make_plan(full, 1, kNoRuntime);
  const TokenShape t{4, 16, 1, Dispatch::kSync};
  double largest = 0.0;
  for (int64_t i = 0; i < 4; ++i)
    largest =
        std::max(largest, recomputed_layer_bytes(none.model, i, t, ActivationRecompute::kFull));
  const ActivationBytes dense =
      chunk_activation_bytes(none.model, {0, 1, false, false}, t, ActivationRecompute::kNone);
  EXPECT_GT(largest, 0.0);
  EXPECT_DOUBLE_EQ(a.stages[0].recompute_buffers, 0.0);
  EXPECT_DOUBLE_EQ(b.stages[0].pass_scratch, a.stages[0].pass_scratch);
  // Layer 0 is dense, 1-3 MoE: the largest MoE layer's rebuild plus the dense MLP's.
  EXPECT_DOUBLE_EQ(b.stages[0].recompute_buffers, largest + dense.dense_mlp);
  EXPECT_LT(b.stages[0].peak, a.stages[0].peak);
}

// lb_loss_granularity "instance": the routers' loss statistics and gradient hold a row of experts
// per instance of the micro-batch (4 here) instead of one: lb_score_grad f32, route counts i64 and
// probability sums f64 per (layer, instance, expert).
TEST(PlanRecompute, InstanceLoadBalancingKeepsARowPerInstance) {
  const RunConfig batch = small_config(),
                  instance = small_config({"model.lb_loss_granularity=\"instance\""});
  const TokenShape t{4, 16, 1, Dispatch::kSync};
  const ChunkShape chunk{0, 4, true, true};
  const double e = static_cast<double>(batch.model.num_experts);
  const double grown =
      chunk_activation_bytes(instance.model, chunk, t, ActivationRecompute::kNone).head -
      chunk_activation_bytes(batch.model, chunk, t, ActivationRecompute::kNone).head;
  EXPECT_DOUBLE_EQ(grown, (4.0 + 16.0) * 4 * e * (4 - 1));
}

double ep_bytes(const std::string& mode, const std::string& dispatch, const std::string& op) {
  const Plan p = make_plan(small_config({"parallel.ep=2", "parallel.dispatch=\"" + dispatch + "\"",
                                         "train.recompute=\"" + mode + "\""}),
                           2, kNoRuntime);
  double total = 0.0;
  for (const CollectiveBytes& c : p.comms[0])
    if (c.group == "ep" && c.op == op) total += c.bytes;
  return total;
}

TEST(PlanRecompute, RecomputedMoeForwardExchangesAgain) {
  // The rows of one pass direction (test_plan.cpp, ExpertAndPipelineTraffic): 3 MoE layers x 2
  // micro-batches x 32 remote routes x 32 floats. Forward out and back, backward out and back,
  // and once more out and back when the backward re-runs the MoE forward.
  const double one_way = 4.0 * 32.0 * 32.0 * 3.0 * 2.0;
  EXPECT_DOUBLE_EQ(ep_bytes("none", "sync", "alltoallv"), 4.0 * one_way);
  EXPECT_DOUBLE_EQ(ep_bytes("attention", "sync", "alltoallv"), 4.0 * one_way);
  EXPECT_DOUBLE_EQ(ep_bytes("full", "sync", "alltoallv"), 6.0 * one_way);
  EXPECT_DOUBLE_EQ(ep_bytes("moe", "rowwise", "put"), 3.0 * one_way);
  EXPECT_DOUBLE_EQ(ep_bytes("moe", "rowwise", "get"), 3.0 * one_way);
}

Seconds pass(const RunConfig& c, bool forward) {
  const ResolvedLayout layout = validate_layout(c, 2);
  return chunk_pass_seconds(c, layout, {0, 4, true, true}, test_rates(), forward);
}

double at(const Seconds& s, TimeCategory c) {
  return s[static_cast<size_t>(static_cast<int>(c))];
}

TEST(PlanRecompute, BackwardAddsTheRecomputedForward) {
  // ep 2: the recomputed MoE forward re-does its exchange too.
  const RunConfig none = small_config({"parallel.ep=2"});
  const Seconds fwd = pass(none, true), bwd = pass(none, false);
  for (const char* mode : {"full", "attention", "moe"}) {
    const RunConfig c =
        small_config({"parallel.ep=2", std::string("train.recompute=\"") + mode + "\""});
    const bool attn = std::string(mode) != "moe", ffn = std::string(mode) != "attention";
    const Seconds f = pass(c, true), b = pass(c, false);
    EXPECT_EQ(f, fwd) << mode;  // the forward does not change
    EXPECT_DOUBLE_EQ(
        at(b, TimeCategory::kAttention),
        at(bwd, TimeCategory::kAttention) + (attn ? at(fwd, TimeCategory::kAttention) : 0.0))
        << mode;
    for (TimeCategory cat :
         {TimeCategory::kDenseMlp, TimeCategory::kExperts, TimeCategory::kExpertExchange})
      EXPECT_DOUBLE_EQ(at(b, cat), at(bwd, cat) + (ffn ? at(fwd, cat) : 0.0)) << mode;
    EXPECT_DOUBLE_EQ(at(b, TimeCategory::kLmHead), at(bwd, TimeCategory::kLmHead)) << mode;
    EXPECT_GT(at(b, TimeCategory::kElementwise), at(bwd, TimeCategory::kElementwise)) << mode;
  }
}

}  // namespace
}  // namespace moecore::plan
