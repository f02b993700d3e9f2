// Pipeline model chunks in one process: the model cut into chunks, with hidden states and their
// gradients handed from chunk to chunk, computes the same losses and gradients as the whole model
// (bit for bit: the same kernels run on the same rows in the same order), several micro-batches
// can be in flight at once, and the settings a pipeline cannot split are refused.
#include <gtest/gtest.h>

#include <vector>

#include "core/check.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tiny_moe_config.h"

namespace moecore {
namespace {

ModelConfig chunk_config() {
  ModelConfig c = tiny_moe_config(4);
  c.lb_loss_style = LbLossStyle::kOlmoCore;
  return c;
}

// Every chunk gets the targets: the chunk with the head computes the cross-entropy, and every
// chunk counts them (loss_normalizer = "labels" divides its router losses by their global count;
// a chunk that did not would drop its layers' router losses).
void expect_chained_chunks_equal_the_whole_model(LossNormalizer normalizer) {
  ModelConfig c = chunk_config();
  c.loss_normalizer = normalizer;
  c.router_z_loss_coef = 0.01;
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout), whole_grads(layout), chunk_grads(layout);
  fill_tiny_params(layout, 7, params);
  const int64_t batch = 2, seq = 5, n = batch * seq, d = c.hidden_size;
  // Two micro-batches, both in flight in the chunks before either backward (as 1F1B's warm-up).
  const std::vector<std::vector<int32_t>> tokens = {{1, 5, 9, 5, 0, 3, 10, 7, 12, 2},
                                                    {4, 4, 8, 11, 6, 1, 0, 9, 3, 7}};
  const std::vector<std::vector<int32_t>> targets = {{5, 9, kIgnoreIndex, 2, 3, 10, 7, 4, 1, 0},
                                                     {4, 8, 11, 6, 1, 0, 9, 3, 7, kIgnoreIndex}};
  Transformer whole(c, layout);
  double whole_total = 0.0;
  for (size_t mb = 0; mb < 2; ++mb) {
    whole_total += whole.forward(params, tokens[mb].data(), targets[mb].data(), batch, seq).total;
    whole.backward(params, whole_grads, 0.5f);
  }

  Transformer first(c, layout, nullptr, {0, 1}), middle(c, layout, nullptr, {1, 3}),
      last(c, layout, nullptr, {3, -1});
  EXPECT_TRUE(first.has_embedding() && !first.has_head());
  EXPECT_TRUE(last.has_head() && !last.has_embedding());
  std::vector<std::vector<float>> h1(2, std::vector<float>(static_cast<size_t>(n * d))), h2 = h1;
  for (size_t mb = 0; mb < 2; ++mb) {
    const auto slot = static_cast<int64_t>(mb);
    first.forward_chunk(slot, params, tokens[mb].data(), nullptr, targets[mb].data(), batch, seq,
                        h1[mb].data());
    middle.forward_chunk(slot, params, nullptr, h1[mb].data(), targets[mb].data(), batch, seq,
                         h2[mb].data());
    last.forward_chunk(slot, params, nullptr, h2[mb].data(), targets[mb].data(), batch, seq,
                       nullptr);
  }
  double chunk_total = 0.0, chunk_lb = 0.0;
  for (Transformer* chunk : {&first, &middle, &last}) {
    const std::vector<LossParts> parts = chunk->read_losses();
    ASSERT_EQ(parts.size(), 2u);  // one per micro-batch
    for (const LossParts& part : parts) {
      chunk_total += part.total;
      chunk_lb += part.lb;
    }
  }
  EXPECT_GT(chunk_lb, 0.0);
  for (size_t mb = 0; mb < 2; ++mb) {
    const auto slot = static_cast<int64_t>(mb);
    std::vector<float> d2(static_cast<size_t>(n * d)), d1(static_cast<size_t>(n * d));
    last.backward_chunk(slot, params, chunk_grads, 0.5f, nullptr, d2.data());
    middle.backward_chunk(slot, params, chunk_grads, 0.5f, d2.data(), d1.data());
    first.backward_chunk(slot, params, chunk_grads, 0.5f, d1.data(), nullptr);
  }
  EXPECT_NEAR(chunk_total, whole_total, 1e-12 * std::abs(whole_total));
  EXPECT_EQ(host_copy(chunk_grads.dense), host_copy(whole_grads.dense));
  EXPECT_EQ(host_copy(chunk_grads.expert), host_copy(whole_grads.expert));
}

TEST(TransformerChunks, ChainedChunksEqualTheWholeModel) {
  for (const LossNormalizer normalizer : {LossNormalizer::kTokens, LossNormalizer::kLabels}) {
    SCOPED_TRACE(normalizer == LossNormalizer::kTokens ? "tokens" : "labels");
    expect_chained_chunks_equal_the_whole_model(normalizer);
  }
}

// The trainer hands each pass its global micro-batch's counts (it reads the whole batch): the pass
// then sums neither over the group, with the same losses and gradients; the counts are for one
// pass only.
TEST(TransformerChunks, GivenBatchCountsReplaceTheirSumForOnePass) {
  ModelConfig c = chunk_config();
  c.loss_normalizer = LossNormalizer::kLabels;
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout), summed_grads(layout), given_grads(layout);
  fill_tiny_params(layout, 7, params);
  const std::vector<int32_t> tokens = {1, 5, 9, 5, 0, 3, 10, 7, 12, 2};
  const std::vector<int32_t> targets = {5, 9, kIgnoreIndex, 2, 3, 10, 7, 4, 1, kIgnoreIndex};
  Transformer model(c, layout);
  int64_t count_sums = 0;  // sums of the two host counts (a group of one: the values stay)
  model.set_batch_sum([&](void*, int64_t count, DType type) {
    count_sums += count == 2 && type == DType::kF64 ? 1 : 0;
  });
  const LossParts summed = model.forward(params, tokens.data(), targets.data(), 2, 5);
  model.backward(params, summed_grads, 1.0f);
  EXPECT_EQ(count_sums, 1);
  model.set_next_batch_counts({.counted_targets = 8, .tokens = 10});
  const LossParts given = model.forward(params, tokens.data(), targets.data(), 2, 5);
  model.backward(params, given_grads, 1.0f);
  EXPECT_EQ(count_sums, 1);  // not summed
  EXPECT_EQ(given.ce, summed.ce);
  EXPECT_EQ(given.lb, summed.lb);
  EXPECT_EQ(given.z, summed.z);
  EXPECT_EQ(given.counted_tokens, 8);
  EXPECT_EQ(host_copy(given_grads.dense), host_copy(summed_grads.dense));
  EXPECT_EQ(host_copy(given_grads.expert), host_copy(summed_grads.expert));
  // The next pass counts and sums its own again; counts the caller got wrong change the loss.
  model.forward(params, tokens.data(), targets.data(), 2, 5);
  EXPECT_EQ(count_sums, 2);
  model.set_next_batch_counts({.counted_targets = 16, .tokens = 20});
  const LossParts doubled = model.forward(params, tokens.data(), targets.data(), 2, 5);
  EXPECT_NEAR(doubled.ce, summed.ce / 2.0, 1e-12 * summed.ce);
}

TEST(TransformerChunks, ARouterChunkWithoutTargetsIsRefusedUnderTheLabelsNormaliser) {
  ModelConfig c = chunk_config();
  c.loss_normalizer = LossNormalizer::kLabels;
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  fill_tiny_params(layout, 7, params);
  Transformer first(c, layout, nullptr, {0, 2});
  const std::vector<int32_t> tokens(10, 1);
  std::vector<float> hidden(static_cast<size_t>(10 * c.hidden_size));
  try {
    first.forward_chunk(0, params, tokens.data(), nullptr, nullptr, 2, 5, hidden.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss_normalizer = \"labels\""), std::string::npos)
        << e.what();
  }
}

TEST(TransformerChunks, StageLayoutsHoldOnlyTheirLayers) {
  const ModelConfig c = chunk_config();
  const ParamLayout first = ParamLayout::build(c, 1, 0, {{0, 2}});
  const ParamLayout last = ParamLayout::build(c, 1, 0, {{2, -1}});
  EXPECT_NE(first.find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(first.find("lm_head.weight"), nullptr);
  EXPECT_EQ(first.find("model.layers.2.input_layernorm.weight"), nullptr);
  EXPECT_NE(last.find("lm_head.weight"), nullptr);
  EXPECT_NE(last.find("model.norm.weight"), nullptr);
  EXPECT_EQ(last.find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(first.specs().size() + last.specs().size(), ParamLayout::build(c).specs().size());
}

TEST(TransformerChunks, RefusesWhatAPipelineCannotSplit) {
  ModelConfig c = chunk_config();
  c.lb_loss_style = LbLossStyle::kHf;  // one loss over every layer's router
  const ParamLayout layout = ParamLayout::build(c);
  EXPECT_THROW(Transformer(c, layout, nullptr, {0, 2}), Error);
  c.lb_loss_style = LbLossStyle::kOlmoCore;
  c.tie_word_embeddings = true;  // the embedding and the head on different stages
  EXPECT_THROW(ParamLayout::build(c, 1, 0, {{0, 2}}), Error);
}

}  // namespace
}  // namespace moecore
