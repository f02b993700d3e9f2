// Activation recompute (train.recompute): for every mode, the loss parts and every parameter
// gradient equal those of "none" bit for bit (the backward re-runs the same deterministic forward
// on the same saved inputs), over the block variants that change what a block caches: softmax and
// sigmoid routers (with the selection bias), a shared expert, a dense first layer, QK-norm and
// reordered norms, with two micro-batches in flight in pipeline chunks, and random routing (the
// recomputed forward must reuse the first forward's routing draws).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/ignore_index.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"

namespace moecore {
namespace {

ModelConfig small_config() {
  return tiny_moe_config(3);
}

struct RecomputeVariant {
  std::string name;
  ModelConfig config;
};

std::vector<RecomputeVariant> variants() {
  std::vector<RecomputeVariant> out;
  out.push_back({"softmax_pre_norm", small_config()});
  ModelConfig sigmoid = small_config();
  sigmoid.router_score = RouterScore::kSigmoid;
  sigmoid.router_bias_update_rate = 0.01;
  sigmoid.qk_norm = QkNorm::kPerHead;
  out.push_back({"sigmoid_bias_qk_norm", sigmoid});
  ModelConfig reordered = small_config();
  reordered.block_norm = BlockNorm::kReordered;
  reordered.qk_norm = QkNorm::kFull;
  reordered.lb_loss_style = LbLossStyle::kHf;
  out.push_back({"reordered_hf_lb", reordered});
  ModelConfig random = small_config();
  random.routing = Routing::kRandom;
  out.push_back({"random_routing", random});
  return out;
}

const std::vector<std::vector<int32_t>> kTokens = {{1, 5, 9, 5, 0, 3, 10, 7, 12, 2},
                                                   {4, 4, 8, 11, 6, 1, 0, 9, 3, 7}};
const std::vector<std::vector<int32_t>> kTargets = {{5, 9, kIgnoreIndex, 2, 3, 10, 7, 4, 1, 0},
                                                    {4, 8, 11, 6, 1, 0, 9, 3, 7, kIgnoreIndex}};
constexpr int64_t kBatch = 2, kSeq = 5;

// Two micro-batches of gradient accumulation through the whole model.
struct Result {
  std::vector<LossParts> losses;
  std::vector<float> grads;
  std::vector<int32_t> topk;  // the router state left by the last pass (metrics read it)
  std::vector<float> params;  // after the selection-bias update (routes tallied in the forward)
};

Result run_whole(const ModelConfig& c, ActivationRecompute mode) {
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout), grads(layout);
  fill_tiny_params(layout, 11, params);
  Transformer model(c, layout);
  model.set_recompute(mode);
  Result r;
  for (size_t mb = 0; mb < 2; ++mb) {
    model.set_routing_seed(100 + mb);
    r.losses.push_back(
        model.forward(params, kTokens[mb].data(), kTargets[mb].data(), kBatch, kSeq));
    // A later micro-batch's seed set before this backward must not change its routing.
    model.set_routing_seed(999);
    model.backward(params, grads, 0.5f);
  }
  r.grads = host_copy(grads.dense);
  const std::vector<float> expert_grads = host_copy(grads.expert);
  r.grads.insert(r.grads.end(), expert_grads.begin(), expert_grads.end());
  r.topk = host_copy(model.router_state(c.num_hidden_layers - 1)->topk_index);
  model.update_router_bias(params);
  r.params = host_copy(params.dense);
  return r;
}

// The same two micro-batches through two pipeline chunks, both in flight before either backward.
Result run_chunks(const ModelConfig& config, ActivationRecompute mode) {
  ModelConfig c = config;
  c.lb_loss_style = LbLossStyle::kOlmoCore;  // the HF loss is one over all layers: no pipeline
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout), grads(layout);
  fill_tiny_params(layout, 11, params);
  Transformer first(c, layout, nullptr, {0, 2}), last(c, layout, nullptr, {2, -1});
  first.set_recompute(mode);
  last.set_recompute(mode);
  const int64_t n = kBatch * kSeq, d = c.hidden_size;
  std::vector<std::vector<float>> hidden(2, std::vector<float>(static_cast<size_t>(n * d)));
  std::vector<float> d_hidden(static_cast<size_t>(n * d));
  Result r;
  for (size_t mb = 0; mb < 2; ++mb) {
    const auto slot = static_cast<int64_t>(mb);
    first.forward_chunk(slot, params, kTokens[mb].data(), nullptr, nullptr, kBatch, kSeq,
                        hidden[mb].data());
    last.forward_chunk(slot, params, nullptr, hidden[mb].data(), kTargets[mb].data(), kBatch, kSeq,
                       nullptr);
  }
  // Each chunk's two passes, in order.
  const std::vector<LossParts> a = first.read_losses(), b = last.read_losses();
  for (size_t mb = 0; mb < 2; ++mb)
    r.losses.push_back({.ce = a[mb].ce + b[mb].ce,
                        .lb = a[mb].lb + b[mb].lb,
                        .z = a[mb].z + b[mb].z,
                        .lm_z = a[mb].lm_z + b[mb].lm_z,
                        .total = a[mb].total + b[mb].total,
                        .counted_tokens = b[mb].counted_tokens});
  for (int64_t slot = 1; slot >= 0; --slot) {
    last.backward_chunk(slot, params, grads, 0.5f, nullptr, d_hidden.data());
    first.backward_chunk(slot, params, grads, 0.5f, d_hidden.data(), nullptr);
  }
  r.grads = host_copy(grads.dense);
  const std::vector<float> expert_grads = host_copy(grads.expert);
  r.grads.insert(r.grads.end(), expert_grads.begin(), expert_grads.end());
  r.topk = host_copy(last.router_state(c.num_hidden_layers - 1)->topk_index);
  return r;
}

void expect_identical(const Result& none, const Result& mode, const std::string& what) {
  ASSERT_EQ(none.losses.size(), mode.losses.size()) << what;
  for (size_t i = 0; i < none.losses.size(); ++i) {
    EXPECT_EQ(none.losses[i].ce, mode.losses[i].ce) << what;
    EXPECT_EQ(none.losses[i].lb, mode.losses[i].lb) << what;
    EXPECT_EQ(none.losses[i].z, mode.losses[i].z) << what;
    EXPECT_EQ(none.losses[i].total, mode.losses[i].total) << what;
  }
  ASSERT_EQ(none.grads.size(), mode.grads.size()) << what;
  // Bit for bit: memcmp also tells -0 from +0 and compares NaN payloads.
  EXPECT_EQ(std::memcmp(none.grads.data(), mode.grads.data(), none.grads.size() * sizeof(float)), 0)
      << what;
  EXPECT_EQ(none.topk, mode.topk) << what;
  EXPECT_EQ(none.params, mode.params) << what;
}

const std::vector<std::pair<std::string, ActivationRecompute>> kRecomputeModes = {
    {"full", ActivationRecompute::kFull},
    {"moe", ActivationRecompute::kMoe},
    {"attention", ActivationRecompute::kAttention}};

TEST(ActivationRecompute, EveryModeGivesTheLossesAndGradientsOfNone) {
  for (const RecomputeVariant& v : variants()) {
    const Result none = run_whole(v.config, ActivationRecompute::kNone);
    // The comparison can fail: the gradients are not all zero.
    bool any_nonzero = false;
    for (float g : none.grads) any_nonzero = any_nonzero || g != 0.0f;
    ASSERT_TRUE(any_nonzero) << v.name;
    for (const auto& [name, mode] : kRecomputeModes)
      expect_identical(none, run_whole(v.config, mode), v.name + " recompute=" + name);
  }
}

TEST(ActivationRecompute, PipelineChunksWithMicroBatchesInFlight) {
  for (const RecomputeVariant& v : variants()) {
    const Result none = run_chunks(v.config, ActivationRecompute::kNone);
    for (const auto& [name, mode] : kRecomputeModes)
      expect_identical(none, run_chunks(v.config, mode), v.name + " chunks recompute=" + name);
  }
}

TEST(ActivationRecompute, ObserverSeesEachForwardTensorOnce) {
  // moecore dump/diff name every tensor once; the recomputed forward must not report again.
  const ModelConfig c = small_config();
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout), grads(layout);
  fill_tiny_params(layout, 11, params);
  auto names_of = [&](ActivationRecompute mode) {
    Transformer model(c, layout);
    model.set_recompute(mode);
    std::vector<std::string> names;
    model.set_tensor_observer(
        [&](const std::string& name, ConstTensorView) { names.push_back(name); });
    model.forward(params, kTokens[0].data(), kTargets[0].data(), kBatch, kSeq);
    model.backward(params, grads, 1.0f);
    return names;
  };
  const std::vector<std::string> none = names_of(ActivationRecompute::kNone);
  for (const auto& [name, mode] : kRecomputeModes) EXPECT_EQ(names_of(mode), none) << name;
}

}  // namespace
}  // namespace moecore
