// Whole-model finite-difference check of d loss.total / d params on a tiny 2-layer transformer
// (dense first layer, MoE second layer with a shared expert), plus loss_scale, the += rule and
// the id range checks of Transformer::forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/check.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/params.h"
#include "model/transformer.h"

namespace moecore {
namespace {

using gradcheck::central_difference;
using gradcheck::GradCheck;
using gradcheck::random_vec;

struct GradientVariant {
  bool tied;
  LbLossStyle lb_style;
  RouterScore score;
  bool norm_topk;
  QkNorm qk_norm;
  BlockNorm block_norm = BlockNorm::kPre;
  LossNormalizer normalizer = LossNormalizer::kTokens;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  double router_bias_update_rate = 0.0;
  int32_t document_eos = -1;       // data.document_masking's EOS; -1: plain causal attention
  int64_t head_chunk_tokens = 0;   // train.lm_head_chunk_tokens (0: the whole head)
  double z_loss_multiplier = 0.0;  // train.z_loss_multiplier (the LM head's z-loss)
};

ModelConfig tiny_config(const GradientVariant& v) {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = v.tied;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 6;
  c.intermediate_size = 10;
  c.first_k_dense_replace = 1;
  c.shared_expert_intermediate_size = 4;
  c.norm_topk_prob = v.norm_topk;
  c.router_aux_loss_coef = 0.5;  // large enough that the lb term shows in the gradient
  c.router_z_loss_coef = 0.05;
  c.qk_norm = v.qk_norm;
  c.router_score = v.score;
  c.lb_loss_style = v.lb_style;
  c.block_norm = v.block_norm;
  c.loss_normalizer = v.normalizer;
  c.n_group = v.n_group;
  c.topk_group = v.topk_group;
  c.routed_scaling_factor = v.routed_scaling_factor;
  c.router_bias_update_rate = v.router_bias_update_rate;
  return c;
}

// O(1) weights instead of init_params' N(0, 0.02), so every path carries a visible gradient.
void randomize(const ParamLayout& layout, ParamBuffers& params, uint32_t seed) {
  for (const ParamSpec& spec : layout.specs()) {
    const bool router = spec.name.find("mlp.gate.weight") != std::string::npos;
    const std::vector<float> v =
        spec.is_norm ? random_vec(spec.numel, seed, 0.7f, 1.3f)
                     : random_vec(spec.numel, seed, router ? -1.5f : -0.5f, router ? 1.5f : 0.5f);
    std::copy(v.begin(), v.end(), params.at(spec));
    ++seed;
  }
}

std::vector<int32_t> selected_sets(const Transformer& model) {
  std::vector<int32_t> all;
  const ModelConfig& c = model.config();
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const RouterState* st = model.router_state(layer);
    if (st == nullptr) continue;
    std::vector<int32_t> s = host_copy(st->topk_index);
    const auto k = static_cast<std::ptrdiff_t>(c.num_experts_per_tok);
    for (auto it = s.begin(); it != s.end(); it += k) std::sort(it, it + k);
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

void check_model(const GradientVariant& v, uint32_t seed) {
  const ModelConfig c = tiny_config(v);
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  randomize(layout, params, seed);
  const int64_t batch = 2, seq = 4;
  const std::vector<int32_t> tokens = {1, 5, 9, 5, 0, 3, 10, 7};
  const std::vector<int32_t> targets = {5, 9, kIgnoreIndex, 2, 3, 10, 7, 4};
  Transformer model(c, layout);
  model.set_document_masking(v.document_eos);
  model.set_lm_head_chunk_tokens(v.head_chunk_tokens);
  model.set_z_loss_multiplier(v.z_loss_multiplier);
  const LossParts base = model.forward(params, tokens.data(), targets.data(), batch, seq);
  EXPECT_EQ(base.counted_tokens, 7);
  if (v.document_eos >= 0) {
    // The mask is in effect: the same weights without it give other logits.
    const std::vector<float> masked = host_copy(model.logits());
    Transformer plain(c, layout);
    plain.forward(params, tokens.data(), targets.data(), batch, seq);
    const std::vector<float> plain_logits = host_copy(plain.logits());
    double diff = 0.0;
    for (size_t i = 0; i < masked.size(); ++i)
      diff = std::max(diff, std::abs(static_cast<double>(masked[i] - plain_logits[i])));
    EXPECT_GT(diff, 1e-3) << "document masking changed nothing";
  }
  EXPECT_GT(base.lb, 0.0);
  EXPECT_GT(base.z, 0.0);
  EXPECT_GT(base.lm_z, 0.0);
  EXPECT_NEAR(base.total,
              base.ce + c.router_aux_loss_coef * base.lb + c.router_z_loss_coef * base.z +
                  v.z_loss_multiplier * base.lm_z,
              1e-12);
  const std::vector<int32_t> selection = selected_sets(model);
  ParamBuffers grads(layout);
  model.backward(params, grads, 1.0f);

  bool changed = false;
  auto loss = [&] {
    const LossParts l = model.forward(params, tokens.data(), targets.data(), batch, seq);
    changed |= selected_sets(model) != selection;
    return l.total;
  };
  std::mt19937 gen(seed);
  const float eps = 5e-3f;
  int skipped = 0, checked = 0;
  GradCheck global;
  std::vector<std::pair<std::string, GradCheck>> per_tensor;
  for (const ParamSpec& spec : layout.specs()) {
    // A few random elements; for the embedding, elements of rows the batch uses.
    std::vector<size_t> indices;
    for (int i = 0; i < 3; ++i) {
      if (spec.is_embedding) {
        const size_t row = static_cast<size_t>(tokens[gen() % tokens.size()]);
        const size_t dim = static_cast<size_t>(c.hidden_size);
        indices.push_back(row * dim + gen() % dim);
      } else {
        indices.push_back(gen() % spec.numel);
      }
    }
    GradCheck r;
    float* p = params.at(spec);
    const float* g = grads.at(spec);
    for (size_t i : indices) {
      changed = false;
      const double numeric = central_difference(p, i, eps, loss);
      if (changed) {
        ++skipped;
        continue;
      }
      ++checked;
      r.max_err = std::max(r.max_err, std::abs(static_cast<double>(g[i]) - numeric));
      r.max_ref = std::max(r.max_ref, std::abs(numeric));
      ++r.checked;
    }
    global.max_err = std::max(global.max_err, r.max_err);
    global.max_ref = std::max(global.max_ref, r.max_ref);
    per_tensor.emplace_back(spec.name, r);
  }
  EXPECT_LE(skipped, checked / 10) << "too many perturbations changed the routing";
  // Tolerance relative to max(|numeric| over the tensor's sample, 1e-2 * the largest |numeric| of
  // the whole model): a tensor whose sampled gradients are all tiny is compared against the
  // model's gradient scale rather than against its own rounding noise. That floor is where the
  // fp32 noise of the whole-model loss, ~u |L| / eps ~ 1e-5 absolute, is largest relative to the
  // denominator: measured worst 3.8e-3 (AVX-512 kernels) and 2.7e-3 (AVX2), 2.6x under kTolerance;
  // a wrong gradient term is off by O(1).
  for (const auto& [name, r] : per_tensor) {
    const double denom = std::max(r.max_ref, 1e-2 * global.max_ref);
    EXPECT_LT(r.max_err / denom, gradcheck::kTolerance)
        << name << ": max|analytic - numeric| = " << r.max_err << ", max|numeric| = " << r.max_ref;
  }
}

TEST(TransformerGradients, TiedOlmoCoreLbSoftmax) {
  check_model({true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull}, 1000);
}
TEST(TransformerGradients, UntiedHfLbSigmoidNormTopk) {
  check_model({false, LbLossStyle::kHf, RouterScore::kSigmoid, true, QkNorm::kPerHead}, 2000);
}
TEST(TransformerGradients, TiedHfLbSoftmaxNormTopk) {
  check_model({true, LbLossStyle::kHf, RouterScore::kSoftmax, true, QkNorm::kNone}, 3000);
}
TEST(TransformerGradients, UntiedOlmoCoreLbSigmoid) {
  check_model({false, LbLossStyle::kOlmoCore, RouterScore::kSigmoid, false, QkNorm::kFull}, 4000);
}

// Issue 12: OLMo-2's reordered block (norm after each sublayer), the labels normaliser of the
// router losses, and the routing options (top-k softmax, groups, weight scale, selection bias).
TEST(TransformerGradients, ReorderedNormsOlmoCoreLbSoftmax) {
  check_model({true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull,
               BlockNorm::kReordered},
              5000);
}
TEST(TransformerGradients, ReorderedNormsSigmoidLabelsNormaliser) {
  check_model({false, LbLossStyle::kOlmoCore, RouterScore::kSigmoid, true, QkNorm::kPerHead,
               BlockNorm::kReordered, LossNormalizer::kLabels},
              6000);
}
TEST(TransformerGradients, TopkSoftmaxGroupsScaleAndBias) {
  check_model({false, LbLossStyle::kOlmoCore, RouterScore::kTopkSoftmax, false, QkNorm::kFull,
               BlockNorm::kPre, LossNormalizer::kLabels, 2, 1, 2.5, 1e-3},
              7000);
  check_model({true, LbLossStyle::kOlmoCore, RouterScore::kSigmoid, true, QkNorm::kFull,
               BlockNorm::kPre, LossNormalizer::kTokens, 2, 1, 2.5, 1e-3},
              8000);
}

// loss_normalizer = "labels" divides the router losses by the counted labels instead of all
// tokens (OLMo-core's trainer); the cross-entropy is unchanged.
TEST(TransformerGradients, LabelsNormaliserScalesRouterLossesByTokensOverLabels) {
  GradientVariant v{false, LbLossStyle::kOlmoCore, RouterScore::kSigmoid, false, QkNorm::kFull};
  const ModelConfig tokens_config = tiny_config(v);
  v.normalizer = LossNormalizer::kLabels;
  const ModelConfig labels_config = tiny_config(v);
  const ParamLayout layout = ParamLayout::build(tokens_config);
  ParamBuffers params(layout);
  randomize(layout, params, 77);
  const std::vector<int32_t> tokens = {1, 5, 9, 5, 0, 3, 10, 7};
  const std::vector<int32_t> targets = {5, kIgnoreIndex, kIgnoreIndex, 2, 3, 10, 7, 4};
  Transformer by_tokens(tokens_config, layout), by_labels(labels_config, layout);
  const LossParts a = by_tokens.forward(params, tokens.data(), targets.data(), 2, 4);
  const LossParts b = by_labels.forward(params, tokens.data(), targets.data(), 2, 4);
  ASSERT_EQ(b.counted_tokens, 6);
  EXPECT_EQ(a.ce, b.ce);
  EXPECT_NEAR(b.lb, a.lb * 8.0 / 6.0, 1e-12 * b.lb);
  EXPECT_NEAR(b.z, a.z * 8.0 / 6.0, 1e-12 * b.z);
  // No counted label: no router loss (nothing to divide by), finite everything.
  const std::vector<int32_t> ignored(8, kIgnoreIndex);
  const LossParts none = by_labels.forward(params, tokens.data(), ignored.data(), 2, 4);
  EXPECT_EQ(none.lb, 0.0);
  EXPECT_EQ(none.z, 0.0);
  ParamBuffers grads(layout);
  by_labels.backward(params, grads, 1.0f);
  for (float g : grads.dense.span()) ASSERT_TRUE(std::isfinite(g));
}

// The selection bias: zero at init, never touched by the gradient, and moved after a step by
// rate * sign(mean count - count) from the routes of every forward since the last clear.
TEST(TransformerGradients, RouterBiasUpdateFollowsCounts) {
  GradientVariant v{false, LbLossStyle::kOlmoCore, RouterScore::kSigmoid, true, QkNorm::kFull};
  v.router_bias_update_rate = 0.125;  // a power of two: the updates are exact
  const ModelConfig c = tiny_config(v);
  const ParamLayout layout = ParamLayout::build(c);
  const ParamSpec* spec = layout.find("model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(spec, nullptr);
  EXPECT_TRUE(spec->is_buffer);
  EXPECT_EQ(layout.find("model.layers.0.mlp.gate.e_score_correction_bias"), nullptr);  // dense
  ParamBuffers params(layout);
  init_params(layout, 3, params);
  for (size_t e = 0; e < spec->numel; ++e) EXPECT_EQ(params.at(*spec)[e], 0.0f);
  randomize(layout, params, 91);
  std::vector<float> bias(params.at(*spec), params.at(*spec) + spec->numel);
  const std::vector<int32_t> tokens = {1, 5, 9, 5, 0, 3, 10, 7};
  const std::vector<int32_t> targets = {5, 9, 1, 2, 3, 10, 7, 4};
  Transformer model(c, layout);
  model.clear_selection_counts();
  std::vector<int64_t> counts(4, 0);
  for (int pass = 0; pass < 2; ++pass) {  // two micro-batches: their counts add up
    model.forward(params, tokens.data(), targets.data(), 2, 4);
    const RouterState* st = model.router_state(1);
    ASSERT_NE(st, nullptr);
    const std::vector<int64_t> layer_counts = host_copy(st->expert_counts);
    for (size_t e = 0; e < 4; ++e) counts[e] += layer_counts[e];
    ParamBuffers grads(layout);
    model.backward(params, grads, 0.5f);
    for (size_t e = 0; e < spec->numel; ++e) EXPECT_EQ(grads.at(*spec)[e], 0.0f);
  }
  const double mean = static_cast<double>(counts[0] + counts[1] + counts[2] + counts[3]) / 4.0;
  model.update_router_bias(params);
  int moved = 0;
  for (size_t e = 0; e < 4; ++e) {
    const double gap = mean - static_cast<double>(counts[e]);
    const float expected = bias[e] + (gap > 0 ? 0.125f : gap < 0 ? -0.125f : 0.0f);
    EXPECT_EQ(params.at(*spec)[e], expected) << "expert " << e;
    moved += gap != 0.0;
  }
  EXPECT_GT(moved, 0) << "the test needs unequal counts";
  // The tally was cleared: a second update without a forward changes nothing.
  const std::vector<float> after(params.at(*spec), params.at(*spec) + spec->numel);
  model.update_router_bias(params);
  EXPECT_EQ(std::vector<float>(params.at(*spec), params.at(*spec) + spec->numel), after);
}

// data.document_masking: id 5 ends documents, so row 0 = {1, 5 | 9, 5} holds two documents and
// row 1 = {0, 3, 10, 7} one; the finite differences run through the masked attention.
TEST(TransformerGradients, DocumentMaskingTiedOlmoCoreLbSoftmax) {
  GradientVariant v{true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull};
  v.document_eos = 5;
  check_model(v, 5000);
}
TEST(TransformerGradients, DocumentMaskingUntiedHfLbSigmoid) {
  GradientVariant v{false, LbLossStyle::kHf, RouterScore::kSigmoid, true, QkNorm::kPerHead};
  v.document_eos = 5;
  check_model(v, 6000);
}
// The reordered block feeds the unnormalised residual into attention, so the loss is more curved
// in the embedding than in the pre-norm block; this is ReorderedNormsOlmoCoreLbSoftmax's model
// (where the central difference at eps 5e-3 is within its bound) with the mask. The exact
// gradient check of masking in the reordered block is the autograd oracle
// (tests/reference/test_document_masking.py, variant "reordered").
TEST(TransformerGradients, DocumentMaskingReorderedNorms) {
  GradientVariant v{true,  LbLossStyle::kOlmoCore, RouterScore::kSoftmax,
                    false, QkNorm::kFull,          BlockNorm::kReordered};
  v.document_eos = 5;
  check_model(v, 5000);
}

// The untied model with the OLMo-core loss and a softmax router, O(1) weights from `seed`, and the
// batch of check_model.
struct UntiedModel {
  explicit UntiedModel(uint32_t seed) { randomize(layout, params, seed); }
  ModelConfig c =
      tiny_config({false, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull});
  ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params{layout};
  std::vector<int32_t> tokens = {1, 5, 9, 5, 0, 3, 10, 7};
  std::vector<int32_t> targets = {5, 9, kIgnoreIndex, 2, 3, 10, 7, 4};
};

// The chunked LM head (model/chunked_lm_head.h): 8 tokens in chunks of 3, 3 and 2.
TEST(TransformerGradients, ChunkedHeadTiedOlmoCoreLbSoftmax) {
  GradientVariant v{true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull};
  v.head_chunk_tokens = 3;
  check_model(v, 1000);
}
TEST(TransformerGradients, ChunkedHeadUntiedHfLbSigmoid) {
  GradientVariant v{false, LbLossStyle::kHf, RouterScore::kSigmoid, true, QkNorm::kPerHead};
  v.head_chunk_tokens = 1;
  check_model(v, 2000);
}

// The LM head's z-loss (train.z_loss_multiplier): 0.1 times lse^2 (lse ~ 3 over 11 tokens) moves
// the logits' gradient by 2 * 0.1 * lse ~ 60%, far outside the tolerance if it were left out.
TEST(TransformerGradients, LmHeadZLossTiedOlmoCoreLbSoftmax) {
  GradientVariant v{true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull};
  v.z_loss_multiplier = 0.1;
  check_model(v, 9000);
}
TEST(TransformerGradients, LmHeadZLossChunkedUntiedHfLbSigmoid) {
  GradientVariant v{false, LbLossStyle::kHf, RouterScore::kSigmoid, true, QkNorm::kPerHead};
  v.z_loss_multiplier = 0.1;
  v.head_chunk_tokens = 3;
  check_model(v, 9100);
}

TEST(TransformerGradients, ChunkedHeadMatchesTheWholeHead) {
  const UntiedModel m(8000);
  const ParamLayout& layout = m.layout;
  const ParamBuffers& params = m.params;
  const std::vector<int32_t>& tokens = m.tokens;
  const std::vector<int32_t>& targets = m.targets;
  Transformer whole(m.c, layout), chunked(m.c, layout);
  chunked.set_lm_head_chunk_tokens(3);
  // What a tensor dump records: the chunked head's logits and their gradient assembled whole.
  std::vector<std::string> observed;
  std::vector<float> observed_logits, observed_dlogits;
  chunked.set_tensor_observer([&](const std::string& name, ConstTensorView t) {
    observed.push_back(name);
    if (name != "lm_head" && name != "grad.lm_head") return;  // (some are i32: top-k ids)
    const std::span<const float> values(t.data<float>("test"), static_cast<size_t>(t.numel()));
    (name == "lm_head" ? observed_logits : observed_dlogits).assign(values.begin(), values.end());
  });
  const LossParts a = whole.forward(params, tokens.data(), targets.data(), 2, 4);
  const LossParts b = chunked.forward(params, tokens.data(), targets.data(), 2, 4);
  // The chunked head keeps no logits, and says so; the observer saw them all once.
  EXPECT_THROW((void)chunked.logits(), Error);
  EXPECT_EQ(std::count(observed.begin(), observed.end(), "lm_head"), 1);
  const std::vector<float> whole_logits = host_copy(whole.logits());
  ASSERT_EQ(observed_logits.size(), whole_logits.size());
  for (size_t i = 0; i < whole_logits.size(); ++i)  // gamma_8 sum|h w| apart at most
    EXPECT_NEAR(observed_logits[i], whole_logits[i], 1e-5f * (1.0f + std::abs(whole_logits[i])))
        << i;
  // The same rows through the same operations: the logits of a row are a length-8 fp32 dot
  // product either way (a GEMM over fewer rows may sum it in another order: gamma_8 |h||w| apart,
  // ~1e-6 here), and the loss adds the chunks' means in double. Relative to the loss, 1e-5 is
  // ~10x that.
  EXPECT_NEAR(b.ce, a.ce, 1e-5 * a.ce);
  EXPECT_EQ(b.counted_tokens, a.counted_tokens);
  EXPECT_DOUBLE_EQ(b.lb, a.lb);  // the layers below the head are the same computation
  EXPECT_DOUBLE_EQ(b.z, a.z);
  ParamBuffers ga(layout), gb(layout);
  whole.backward(params, ga, 0.5f);
  chunked.backward(params, gb, 0.5f);
  // The logits' gradient seen whole: 0.5 (p - onehot) / 7 per counted row, so each row sums to 0
  // (within fp32 rounding of 11 terms), the ignored row is 0, and the target's entry is negative.
  EXPECT_EQ(std::count(observed.begin(), observed.end(), "grad.lm_head"), 1);
  ASSERT_EQ(observed_dlogits.size(), targets.size() * 11);
  for (size_t t = 0; t < targets.size(); ++t) {
    double row = 0.0, largest = 0.0;
    for (size_t j = 0; j < 11; ++j) {
      row += static_cast<double>(observed_dlogits[t * 11 + j]);
      largest = std::max(largest, std::abs(static_cast<double>(observed_dlogits[t * 11 + j])));
    }
    if (targets[t] == kIgnoreIndex) {
      EXPECT_EQ(largest, 0.0) << t;
      continue;
    }
    EXPECT_NEAR(row, 0.0, 1e-6) << t;
    EXPECT_LT(observed_dlogits[t * 11 + static_cast<size_t>(targets[t])], 0.0f) << t;
  }
  // Gradients: the head's sums (over 11 vocabulary entries for dhidden, 8 tokens for its weight
  // gradient) in another order, gamma_11 ~ 7e-7 relative to their terms, carried through two
  // layers; relative to each tensor's largest gradient, 1e-5 leaves >10x room. A wrong chunk or a
  // lost loss_scale is off by O(1).
  for (const ParamSpec& spec : layout.specs()) {
    double largest = 0.0, diff = 0.0;
    for (size_t i = 0; i < spec.numel; ++i) {
      const double x = static_cast<double>(ga.at(spec)[i]);
      largest = std::max(largest, std::abs(x));
      diff = std::max(diff, std::abs(static_cast<double>(gb.at(spec)[i]) - x));
    }
    EXPECT_LE(diff, 1e-5 * largest) << spec.name;
  }
  // Without targets the forward is for its logits: the whole head's, chunked or not.
  chunked.forward(params, tokens.data(), nullptr, 2, 4);
  whole.forward(params, tokens.data(), nullptr, 2, 4);
  EXPECT_EQ(host_copy(chunked.logits()), host_copy(whole.logits()));
}

// Logits on demand (Transformer::logits_at, what the downstream evaluation reads): the rows asked
// for, in their order (a repeat and the last row among them), are the whole head's rows: the same
// final-norm rows times the same head in the same precision. A GEMM over fewer rows may sum a
// row's length-8 dot product in another order (gamma_8 sum|h w| apart, ~1e-6 here): 1e-5 relative
// leaves ~10x room; a row off by one, or fp32 operands where the head is bf16 (2^-8 relative), is
// off by far more.
TEST(TransformerGradients, LogitsOnDemandAreTheWholeHeadsRows) {
  const UntiedModel m(8100);
  const int64_t vocab = m.c.vocab_size;
  const std::vector<int32_t> rows = {7, 0, 3, 3, 5};
  for (const auto precision : {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
    SCOPED_TRACE(precision == kernels::MatmulPrecision::kFp32 ? "fp32" : "bf16");
    Transformer whole(m.c, m.layout), on_demand(m.c, m.layout);
    whole.set_precision(PrecisionRecipe::from_train_precision(precision));
    on_demand.set_precision(PrecisionRecipe::from_train_precision(precision));
    whole.forward(m.params, m.tokens.data(), nullptr, 2, 4);
    const std::vector<float> all = host_copy(whole.logits());
    on_demand.set_next_logits_on_demand();
    on_demand.forward(m.params, m.tokens.data(), nullptr, 2, 4);
    EXPECT_THROW((void)on_demand.logits(), Error);  // the head kept none
    std::vector<float> got(rows.size() * static_cast<size_t>(vocab));
    on_demand.logits_at(m.params, rows.data(), static_cast<int64_t>(rows.size()), got.data());
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < vocab; ++j) {
        const float want = all[static_cast<size_t>(rows[i] * vocab + j)];
        EXPECT_NEAR(got[i * static_cast<size_t>(vocab) + static_cast<size_t>(j)], want,
                    1e-5f * (1.0f + std::abs(want)))
            << "row " << rows[i] << " column " << j;
      }
    for (const int32_t bad : {-1, 8}) {  // a row outside the pass's 2 x 4 tokens
      EXPECT_THROW(on_demand.logits_at(m.params, &bad, 1, got.data()), Error) << bad;
    }
    // The request lasts one pass: the next forward keeps the whole head's logits again.
    on_demand.forward(m.params, m.tokens.data(), nullptr, 2, 4);
    EXPECT_EQ(host_copy(on_demand.logits()), all);
  }
}

void check_loss_scale(int64_t head_chunk_tokens);

TEST(TransformerGradients, LossScaleScalesAndGradientsAccumulate) {
  for (int64_t head_chunk_tokens : {0, 3}) {
    SCOPED_TRACE("lm_head_chunk_tokens " + std::to_string(head_chunk_tokens));
    check_loss_scale(head_chunk_tokens);
  }
}

void check_loss_scale(int64_t head_chunk_tokens) {
  const UntiedModel m(5000);
  const ParamLayout& layout = m.layout;
  const ParamBuffers& params = m.params;
  const std::vector<int32_t>& tokens = m.tokens;
  const std::vector<int32_t>& targets = m.targets;
  Transformer model(m.c, layout);
  model.set_lm_head_chunk_tokens(head_chunk_tokens);
  model.forward(params, tokens.data(), targets.data(), 2, 4);
  ParamBuffers g1(layout), g4(layout), twice(layout);
  model.backward(params, g1, 1.0f);
  model.backward(params, g4, 4.0f);
  model.backward(params, twice, 1.0f);
  model.backward(params, twice, 1.0f);
  double max_g = 0.0, err4 = 0.0, err2 = 0.0;
  for (const auto& [a, b, t] : {std::tuple{&g1.dense, &g4.dense, &twice.dense},
                                std::tuple{&g1.expert, &g4.expert, &twice.expert}})
    for (size_t i = 0; i < a->size(); ++i) {
      const double x = static_cast<double>(a->span()[i]);
      max_g = std::max(max_g, std::abs(x));
      err4 = std::max(err4, std::abs(static_cast<double>(b->span()[i]) - 4.0 * x));
      err2 = std::max(err2, std::abs(static_cast<double>(t->span()[i]) - 2.0 * x));
    }
  ASSERT_GT(max_g, 0.0);
  // fp32 rounding of the same computation at a different scale, relative to max |gradient|. x4 is
  // a power of two, so the scaled backward is exact (measured 0 on every ISA setting); twice
  // accumulated adds one rounding per element (<= u |g| = 6e-8; measured 1.7e-8).
  EXPECT_LT(err4 / (4.0 * max_g), 1e-5);
  EXPECT_LT(err2 / (2.0 * max_g), 1e-6);
}

void expect_error_naming(const ModelConfig& c, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& targets, const std::string& needle) {
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  init_params(layout, 1, params);
  Transformer model(c, layout);
  try {
    model.forward(params, tokens.data(), targets.data(), 1, static_cast<int64_t>(tokens.size()));
    ADD_FAILURE() << "expected moecore::Error naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TransformerGradients, OutOfRangeIdsThrow) {
  const ModelConfig c =
      tiny_config({true, LbLossStyle::kOlmoCore, RouterScore::kSoftmax, false, QkNorm::kFull});
  expect_error_naming(c, {1, 2, 11, 3}, {1, 2, 3, 4}, "token id 11");
  expect_error_naming(c, {1, -5, 2, 3}, {1, 2, 3, 4}, "token id -5");
  expect_error_naming(c, {1, 2, 3, 4}, {1, 99, 3, 4}, "target id 99");
  expect_error_naming(c, {1, 2, 3, 4}, {1, 2, -1, 4}, "target id -1");
}

}  // namespace
}  // namespace moecore
