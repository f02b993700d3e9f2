// KV-cache inference against the training forward: for every position, the logits of
// InferenceModel (token-by-token decoding, block prefill, and prefill continued in chunks) must
// equal the corresponding row of Transformer::forward over the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/config.h"
#include "model/inference.h"
#include "model/params.h"
#include "model/sampler.h"
#include "model/transformer.h"

namespace moecore {
namespace {

struct InferenceVariant {
  const char* name;
  QkNorm qk_norm;
  int64_t kv_heads;
  int64_t shared;       // shared_expert_intermediate_size
  int64_t dense_first;  // first_k_dense_replace
  bool tied;
  RouterScore score;
  bool norm_topk;
  BlockNorm block_norm = BlockNorm::kPre;
  bool router_options = false;  // groups, weight scale and a selection bias
};

// gtest prints a parameter in failure messages; without this it dumps the struct's raw bytes.
void PrintTo(const InferenceVariant& v, std::ostream* os) {
  *os << v.name;
}

ModelConfig make_config(const InferenceVariant& v) {
  ModelConfig c;
  c.vocab_size = 13;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = v.kv_heads;
  c.head_dim = 6;  // q_size 24 != hidden_size: catches a head_dim / hidden mix-up
  c.qk_norm = v.qk_norm;
  c.shared_expert_intermediate_size = v.shared;
  c.first_k_dense_replace = v.dense_first;
  c.tie_word_embeddings = v.tied;
  c.router_score = v.score;
  c.norm_topk_prob = v.norm_topk;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.intermediate_size = 12;
  c.block_norm = v.block_norm;
  if (v.router_options) {
    c.n_group = 2;
    c.topk_group = 1;
    c.routed_scaling_factor = 2.0;
    c.router_bias_update_rate = 1e-3;
  }
  return c;
}

// init_params, then weights ~10x larger (std 0.2, so attention is far from uniform) and norm gains
// away from 1 (so a misplaced QK-norm weight shows).
void init_sharp(const ParamLayout& layout, uint64_t seed, ParamBuffers& params) {
  init_params(layout, seed, params);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> gain(0.5f, 1.5f);
  for (const ParamSpec& spec : layout.specs()) {
    float* w = params.at(spec);
    for (size_t i = 0; i < spec.numel; ++i) w[i] = spec.is_norm ? gain(rng) : 10.0f * w[i];
    // A selection bias (zero at init) large enough to change choices.
    if (spec.is_buffer)
      for (size_t i = 0; i < spec.numel; ++i) w[i] = 0.5f * (gain(rng) - 1.0f);
  }
}

float rel_err(const float* a, const float* b, int64_t n) {
  float diff = 0.0f, ref = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return diff / ref;
}

class InferenceParity : public ::testing::TestWithParam<InferenceVariant> {};

TEST_P(InferenceParity, MatchesFullForwardAtEveryPosition) {
  const ModelConfig c = make_config(GetParam());
  const ParamLayout layout = ParamLayout::build(c);
  ParamBuffers params(layout);
  init_sharp(layout, 7, params);

  const int64_t seq = 11, v = c.vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(seq));
  std::mt19937 rng(3);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(v));
  tokens[5] = tokens[4];  // a repeated token: identical q/k/v rows at different positions

  Transformer model(c, layout);
  model.forward(params, tokens.data(), nullptr, 1, seq);
  const std::vector<float> ref = host_copy(model.logits());
  auto ref_row = [&](int64_t t) { return ref.data() + t * v; };
  // Max |diff| / max |logit|. Decoding multiplies one row at a time (oneDNN picks GEMV-shaped
  // kernels, another summation order than the full forward's GEMMs) through sharp weights (x10):
  // empirical, measured worst 7.3e-7 (AVX-512 and AVX2 kernels alike), 137x headroom. A cache
  // bug (a wrong position, a stale row) moves logits by O(1).
  const float tol = 1e-4f;

  InferenceModel inf(c, layout, params, /*max_seq=*/16);
  // Token by token.
  for (int64_t t = 0; t < seq; ++t) {
    const std::vector<float>& logits = inf.decode_step(tokens[static_cast<size_t>(t)]);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), v);
    EXPECT_LE(rel_err(logits.data(), ref_row(t), v), tol) << "decode position " << t;
  }
  EXPECT_EQ(inf.length(), seq);

  // Block prefill of 6 tokens, then decoding.
  inf.reset();
  EXPECT_EQ(inf.length(), 0);
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 6);
  EXPECT_LE(rel_err(inf.prefill(prompt).data(), ref_row(5), v), tol) << "prefill";
  for (int64_t t = 6; t < seq; ++t)
    EXPECT_LE(rel_err(inf.decode_step(tokens[static_cast<size_t>(t)]).data(), ref_row(t), v), tol)
        << "decode after prefill, position " << t;

  // Prefill continued in chunks (multi-turn): [0, 3), [3, 8), then decode.
  inf.reset();
  inf.prefill({tokens.begin(), tokens.begin() + 3});
  EXPECT_LE(rel_err(inf.prefill({tokens.begin() + 3, tokens.begin() + 8}).data(), ref_row(7), v),
            tol)
      << "second prefill chunk";
  for (int64_t t = 8; t < seq; ++t)
    EXPECT_LE(rel_err(inf.decode_step(tokens[static_cast<size_t>(t)]).data(), ref_row(t), v), tol)
        << "decode after chunked prefill, position " << t;
}

INSTANTIATE_TEST_SUITE_P(
    Inference, InferenceParity,
    ::testing::Values(InferenceVariant{"none_mha_softmax", QkNorm::kNone, 4, 0, 0, false,
                                       RouterScore::kSoftmax, false},
                      InferenceVariant{"full_gqa_shared_dense_tied", QkNorm::kFull, 2, 10, 1, true,
                                       RouterScore::kSoftmax, false},
                      InferenceVariant{"per_head_gqa1_sigmoid_norm", QkNorm::kPerHead, 1, 10, 1,
                                       false, RouterScore::kSigmoid, true},
                      InferenceVariant{"full_gqa_sigmoid_norm_tied", QkNorm::kFull, 2, 0, 0, true,
                                       RouterScore::kSigmoid, true},
                      InferenceVariant{"per_head_mha_softmax_norm_shared", QkNorm::kPerHead, 4, 6,
                                       0, false, RouterScore::kSoftmax, true},
                      InferenceVariant{"reordered_full_gqa_shared_dense", QkNorm::kFull, 2, 10, 1,
                                       false, RouterScore::kSoftmax, false, BlockNorm::kReordered},
                      InferenceVariant{"reordered_per_head_topk_softmax_tied", QkNorm::kPerHead, 4,
                                       0, 0, true, RouterScore::kTopkSoftmax, false,
                                       BlockNorm::kReordered},
                      InferenceVariant{"sigmoid_groups_scale_bias", QkNorm::kPerHead, 2, 6, 1,
                                       false, RouterScore::kSigmoid, true, BlockNorm::kPre, true}),
    [](const ::testing::TestParamInfo<InferenceVariant>& p) { return std::string(p.param.name); });

struct Tiny {
  ModelConfig config;
  ParamLayout layout;
  ParamBuffers params;
  Tiny()
      : config(make_config({"", QkNorm::kFull, 2, 0, 1, false, RouterScore::kSoftmax, false})),
        layout(ParamLayout::build(config)),
        params(layout) {
    init_sharp(layout, 11, params);
  }
};

std::string inference_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A 64-token prefill is large enough for the threaded attention path; decoding continues from it.
TEST(Inference, LongPrefillMatchesFullForward) {
  Tiny t;
  const int64_t seq = 70, v = t.config.vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(seq));
  std::mt19937 rng(5);
  for (auto& tok : tokens) tok = static_cast<int32_t>(rng() % static_cast<uint32_t>(v));
  Transformer model(t.config, t.layout);
  model.forward(t.params, tokens.data(), nullptr, 1, seq);
  const std::vector<float> ref_logits = host_copy(model.logits());
  const float* ref = ref_logits.data();
  InferenceModel inf(t.config, t.layout, t.params, seq);
  // The tolerance of InferenceParity (measured worst 7.3e-7 here).
  EXPECT_LE(rel_err(inf.prefill({tokens.begin(), tokens.begin() + 64}).data(), ref + 63 * v, v),
            1e-4f);
  for (int64_t p = 64; p < seq; ++p)
    EXPECT_LE(rel_err(inf.decode_step(tokens[static_cast<size_t>(p)]).data(), ref + p * v, v),
              1e-4f)
        << "position " << p;
}

TEST(Inference, MaxSeqOverflowIsAnErrorAndLeavesTheCacheUnchanged) {
  Tiny t;
  InferenceModel inf(t.config, t.layout, t.params, /*max_seq=*/4);
  inf.prefill({1, 2, 3});
  inf.decode_step(4);
  EXPECT_EQ(inf.length(), 4);
  const std::string msg = inference_error_of([&] { inf.decode_step(5); });
  EXPECT_NE(msg.find("max_seq=4"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(inf.length(), 4);

  inf.reset();
  EXPECT_THROW(inf.prefill({1, 2, 3, 4, 5}), Error);
  EXPECT_EQ(inf.length(), 0);
  EXPECT_NO_THROW(inf.prefill({1, 2, 3, 4}));

  // generate checks the budget before doing any work: 3 + 3 - 1 = 5 > 4.
  EXPECT_THROW(generate(inf, {1, 2, 3}, 3, {}), Error);
  EXPECT_NO_THROW(generate(inf, {1, 2, 3}, 2, {}));
}

TEST(Inference, BadInputsAreErrors) {
  Tiny t;
  EXPECT_THROW(InferenceModel(t.config, t.layout, t.params, 0), Error);
  InferenceModel inf(t.config, t.layout, t.params, 8);
  EXPECT_THROW(inf.prefill({}), Error);
  const std::string msg = inference_error_of([&] { inf.prefill({1, 13}); });
  EXPECT_NE(msg.find("token id 13"), std::string::npos) << msg;
  EXPECT_THROW(inf.decode_step(-1), Error);
  EXPECT_EQ(inf.length(), 0);
}

TEST(Inference, GreedyGenerateFollowsArgmaxAndStops) {
  Tiny t;
  InferenceModel inf(t.config, t.layout, t.params, 16);
  const std::vector<int32_t> prompt = {3, 1, 4};
  SamplingConfig greedy;
  greedy.temperature = 0.0;
  const std::vector<int32_t> out = generate(inf, prompt, 6, greedy);
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(inf.length(), 3 + 5);  // the last sampled token is not fed back

  // Teacher forcing with the training forward as the oracle: over prompt + out, the argmax at
  // position prompt.size() - 1 + i must be out[i].
  Transformer model(t.config, t.layout);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), out.begin(), out.end());
  model.forward(t.params, seq.data(), nullptr, 1, static_cast<int64_t>(seq.size()));
  const int64_t v = t.config.vocab_size;
  const std::vector<float> logits = host_copy(model.logits());
  for (size_t i = 0; i < out.size(); ++i) {
    const auto row = logits.begin() + static_cast<int64_t>(prompt.size() - 1 + i) * v;
    EXPECT_EQ(argmax(std::vector<float>(row, row + v)), out[i]) << "token " << i;
  }

  // A stop token ends generation after it is emitted (and is kept).
  const std::vector<int32_t> stopped = generate(inf, prompt, 6, greedy, {out[2]});
  const auto first = std::find(out.begin(), out.end(), out[2]);
  EXPECT_EQ(stopped, std::vector<int32_t>(out.begin(), first + 1));
  EXPECT_TRUE(generate(inf, prompt, 0, greedy).empty());

  // Sampled generation is reproducible for a seed.
  SamplingConfig sampled;
  sampled.seed = 42;
  EXPECT_EQ(generate(inf, prompt, 8, sampled), generate(inf, prompt, 8, sampled));
}

}  // namespace
}  // namespace moecore
