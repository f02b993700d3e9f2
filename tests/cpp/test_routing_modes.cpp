// Routing modes (issue 4): model.routing = "random" selects each token's experts by uniform random
// scores from a stream per (seed, global token), "balanced" spreads the routes evenly, and in both
// the routing weights stay the router's scores, so router_backward still trains the router. Also
// the config key (parse, error, round trip) and the Hugging Face config of such a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "gradcheck.h"
#include "io/hf_config.h"
#include "model/config.h"
#include "model/router.h"
#include "train/run_config.h"

namespace moecore {
namespace {

using gradcheck::added;
using gradcheck::check_all;
using gradcheck::expect_close;
using gradcheck::project;
using gradcheck::random_vec;

// The router's state and its tensors copied into host vectors for the checks (the state's arrays
// are where the model's tensors live, a device's in general).
struct Routed {
  RouterState state;
  std::vector<float> logits, scores, topk_weight;
  std::vector<int32_t> topk_index;
  std::vector<int64_t> expert_counts;
};

Routed route(const RouterShape& s, const std::vector<float>& x, const std::vector<float>& w,
             RouterSelection selection) {
  Routed r;
  r.state.selection = selection;
  router_forward(s, x.data(), w.data(), r.state);
  r.logits = host_copy(r.state.logits);
  r.scores = host_copy(r.state.scores);
  r.topk_weight = host_copy(r.state.topk_weight);
  r.topk_index = host_copy(r.state.topk_index);
  r.expert_counts = host_copy(r.state.expert_counts);
  return r;
}

struct Inputs {
  RouterShape shape;
  std::vector<float> x, w;
};

Inputs inputs(int64_t tokens, int64_t experts, int64_t k, bool norm = false,
              RouterScore score = RouterScore::kSoftmax) {
  Inputs in{{tokens, 8, experts, k, score, norm}, {}, {}};
  in.x = random_vec(static_cast<size_t>(tokens * 8), 11);
  in.w = random_vec(static_cast<size_t>(experts * 8), 12);
  return in;
}

TEST(RoutingModes, RandomIsDeterministicPerSeedAndDiffersAcrossSeeds) {
  const Inputs in = inputs(64, 8, 2);
  const uint64_t seed = routing_layer_seed(routing_forward_seed(7, 3, 0), 1);
  const Routed a = route(in.shape, in.x, in.w, {Routing::kRandom, seed, 0});
  const Routed b = route(in.shape, in.x, in.w, {Routing::kRandom, seed, 0});
  EXPECT_EQ(a.topk_index, b.topk_index);
  EXPECT_EQ(a.topk_weight, b.topk_weight);
  // Another training seed, step, micro-batch or layer: another draw.
  for (const uint64_t other : {routing_layer_seed(routing_forward_seed(8, 3, 0), 1),
                               routing_layer_seed(routing_forward_seed(7, 4, 0), 1),
                               routing_layer_seed(routing_forward_seed(7, 3, 1), 1),
                               routing_layer_seed(routing_forward_seed(7, 3, 0), 2)}) {
    ASSERT_NE(other, seed);
    EXPECT_NE(route(in.shape, in.x, in.w, {Routing::kRandom, other, 0}).topk_index, a.topk_index);
  }
  // And not the learned selection.
  EXPECT_NE(route(in.shape, in.x, in.w, {}).topk_index, a.topk_index);
}

TEST(RoutingModes, RandomDependsOnTheTokenNotOnItsInput) {
  // The draw is a function of (seed, global token index) only: the router input does not matter,
  // and a slice routed with its offset gets the routes of the same tokens in the whole batch.
  const Inputs in = inputs(40, 8, 3);
  const Routed whole = route(in.shape, in.x, in.w, {Routing::kRandom, 99, 0});
  std::vector<float> other_x = random_vec(in.x.size(), 77);
  EXPECT_EQ(route(in.shape, other_x, in.w, {Routing::kRandom, 99, 0}).topk_index, whole.topk_index);
  for (const Routing mode : {Routing::kRandom, Routing::kBalanced}) {
    const Routed full = route(in.shape, in.x, in.w, {mode, 99, 0});
    RouterShape half = in.shape;
    half.tokens = 15;
    const std::vector<float> x_tail(in.x.begin() + 25 * 8, in.x.end());
    const Routed tail = route(half, x_tail, in.w, {mode, 99, 25});
    EXPECT_TRUE(std::equal(tail.topk_index.begin(), tail.topk_index.end(),
                           full.topk_index.begin() + 25 * 3));
    // The weights only up to rounding: the router GEMM blocks a slice differently (weights <= 1;
    // logits of 8 terms move by <= 16 u of their size, ~1e-6 at most; measured 6e-8, 0 with AVX2).
    for (size_t r = 0; r < tail.topk_weight.size(); ++r)
      EXPECT_NEAR(tail.topk_weight[r], full.topk_weight[25 * 3 + r], 1e-6f);
  }
}

TEST(RoutingModes, RandomIsRoughlyUniform) {
  const int64_t tokens = 20000, experts = 16, k = 4;
  const Inputs in = inputs(tokens, experts, k);
  const Routed st = route(in.shape, in.x, in.w, {Routing::kRandom, 5, 0});
  // Each expert is chosen with probability k/E per token: mean N k / E, sd sqrt(N k/E (1-k/E)).
  const double mean = static_cast<double>(tokens * k) / static_cast<double>(experts);
  const double sd = std::sqrt(mean * (1.0 - static_cast<double>(k) / experts));
  int64_t total = 0;
  for (const int64_t c : st.expert_counts) {
    EXPECT_LT(std::abs(static_cast<double>(c) - mean), 5.0 * sd) << c;
    total += c;
  }
  EXPECT_EQ(total, tokens * k);
  // Every token's experts are distinct, and every (first, second) slot pair occurs.
  std::set<std::pair<int32_t, int32_t>> pairs;
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> chosen(st.topk_index.begin() + t * k, st.topk_index.begin() + (t + 1) * k);
    ASSERT_EQ(static_cast<int64_t>(chosen.size()), k);
    pairs.insert(
        {st.topk_index[static_cast<size_t>(t * k)], st.topk_index[static_cast<size_t>(t * k + 1)]});
  }
  EXPECT_EQ(static_cast<int64_t>(pairs.size()), experts * (experts - 1));
  // The learned router on the same inputs is far from uniform (the test would catch a no-op).
  const Routed learned = route(in.shape, in.x, in.w, {});
  const int64_t max_learned =
      *std::max_element(learned.expert_counts.begin(), learned.expert_counts.end());
  EXPECT_GT(static_cast<double>(max_learned), mean + 10.0 * sd);
}

TEST(RoutingModes, BalancedGivesExactlyEqualCounts) {
  for (const auto& [tokens, experts, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {8, 8, 1}, {12, 8, 2}, {16, 16, 4}, {6, 4, 4}, {30, 6, 5}, {9, 12, 4}}) {
    ASSERT_EQ(tokens * k % experts, 0);
    const Inputs in = inputs(tokens, experts, k);
    for (const int64_t offset : {int64_t{0}, int64_t{3}, int64_t{1000}}) {
      const Routed st = route(in.shape, in.x, in.w, {Routing::kBalanced, 0, offset});
      for (const int64_t c : st.expert_counts) EXPECT_EQ(c, tokens * k / experts);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < k; ++j)
          EXPECT_EQ(st.topk_index[static_cast<size_t>(t * k + j)],
                    ((offset + t) * k + j) % experts);
    }
  }
  // With data parallelism each rank routes its slice with its offset: the global spread is even
  // even when no single slice's is.
  const Inputs in = inputs(3, 8, 2);  // 3 tokens x 2 routes: 6 of 8 experts on each rank
  std::vector<int64_t> global(8, 0);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const Routed st = route(in.shape, in.x, in.w, {Routing::kBalanced, 0, rank * 3});
    for (size_t e = 0; e < 8; ++e) global[e] += st.expert_counts[e];
  }
  for (const int64_t c : global) EXPECT_EQ(c, 3);
}

TEST(RoutingModes, WeightsAreTheRouterScoresOfTheSelectedExperts) {
  for (const bool norm : {false, true}) {
    for (const RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
      const Inputs in = inputs(10, 6, 3, norm, score);
      for (const Routing mode : {Routing::kRandom, Routing::kBalanced}) {
        const Routed st = route(in.shape, in.x, in.w, {mode, 3, 0});
        for (int64_t t = 0; t < 10; ++t) {
          double sum = 0.0;
          for (int64_t j = 0; j < 3; ++j)
            sum += static_cast<double>(st.scores[static_cast<size_t>(
                t * 6 + st.topk_index[static_cast<size_t>(t * 3 + j)])]);
          for (int64_t j = 0; j < 3; ++j) {
            const size_t r = static_cast<size_t>(t * 3 + j);
            const double s =
                static_cast<double>(st.scores[static_cast<size_t>(t * 6 + st.topk_index[r])]);
            EXPECT_NEAR(static_cast<double>(st.topk_weight[r]), norm ? s / sum : s, 1e-6);
          }
        }
      }
    }
  }
}

// Finite differences of the router loss terms (routing weights, load-balancing, z-loss) with the
// random / balanced selection, which does not depend on the router weights, held fixed by
// construction (asserted): the gradient reaches the router through the weights and the losses.
void check_router_gradient(Routing mode, bool norm, RouterScore score_kind, bool lb_uses_softmax) {
  const RouterShape s{6, 5, 5, 2, score_kind, norm};
  std::vector<float> x = random_vec(static_cast<size_t>(s.tokens * s.dim), 21);
  std::vector<float> w = random_vec(static_cast<size_t>(s.num_experts * s.dim), 22);
  const RouterSelection selection{mode, 1234, 17};
  const Routed st = route(s, x, w, selection);
  ASSERT_NE(st.topk_index, route(s, x, w, {}).topk_index) << "selection equals the learned one";
  const std::vector<float> r = random_vec(static_cast<size_t>(s.tokens * s.top_k), 23);
  const std::vector<float> lbg = random_vec(static_cast<size_t>(s.num_experts), 24);
  const float zs = 0.3f;
  bool selection_changed = false;
  auto loss = [&] {
    const Routed p = route(s, x, w, selection);
    selection_changed |= p.topk_index != st.topk_index;
    double total = project(p.topk_weight.data(), r);
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float* z = p.logits.data() + t * s.num_experts;
      double mx = -1e300;
      for (int64_t e = 0; e < s.num_experts; ++e) mx = std::max(mx, static_cast<double>(z[e]));
      double sum = 0.0;
      for (int64_t e = 0; e < s.num_experts; ++e) sum += std::exp(static_cast<double>(z[e]) - mx);
      const double lse = mx + std::log(sum);
      total += static_cast<double>(zs) * lse * lse;
      // The load-balancing probabilities of router_backward: a sigmoid router's scores are
      // divided by their sum over the experts (OLMo-core).
      const float* score = p.scores.data() + t * s.num_experts;
      double score_sum = 1.0;
      if (!lb_uses_softmax && score_kind == RouterScore::kSigmoid) {
        score_sum = 0.0;
        for (int64_t e = 0; e < s.num_experts; ++e) score_sum += static_cast<double>(score[e]);
      }
      for (int64_t e = 0; e < s.num_experts; ++e) {
        const double prob = lb_uses_softmax ? std::exp(static_cast<double>(z[e]) - lse)
                                            : static_cast<double>(score[e]) / score_sum;
        total += static_cast<double>(lbg[static_cast<size_t>(e)]) * prob;
      }
    }
    return total;
  };
  const std::vector<float> dx_before(x.size(), 0.0f), dw_before(w.size(), 0.0f);
  std::vector<float> dx = dx_before, dw = dw_before;
  Workspace workspace;
  router_backward(s, x.data(), w.data(), st.state, {r.data(), {lbg.data(), lb_uses_softmax, zs}},
                  dx.data(), dw.data(), workspace);
  double norm_dw = 0.0;
  for (const float g : dw) norm_dw += static_cast<double>(g) * static_cast<double>(g);
  EXPECT_GT(norm_dw, 1e-6);
  expect_close(check_all(w.data(), w.size(), added(dw, dw_before).data(), 1e-3f, loss),
               "router dw_router");
  expect_close(check_all(x.data(), x.size(), added(dx, dx_before).data(), 1e-3f, loss),
               "router dx");
  EXPECT_FALSE(selection_changed);
}

TEST(RoutingModes, RouterGradientWithRandomSelection) {
  check_router_gradient(Routing::kRandom, false, RouterScore::kSoftmax, false);
  check_router_gradient(Routing::kRandom, true, RouterScore::kSoftmax, true);
  check_router_gradient(Routing::kRandom, true, RouterScore::kSigmoid, true);
}

TEST(RoutingModes, RouterGradientWithBalancedSelection) {
  check_router_gradient(Routing::kBalanced, false, RouterScore::kSoftmax, false);
  check_router_gradient(Routing::kBalanced, true, RouterScore::kSoftmax, true);
  check_router_gradient(Routing::kBalanced, false, RouterScore::kSigmoid, false);
}

TEST(RoutingModes, ConfigKey) {
  EXPECT_EQ(parse_run_config("", "t.toml").model.routing, Routing::kLearned);
  for (const auto& [text, mode] :
       std::vector<std::pair<std::string, Routing>>{{"learned", Routing::kLearned},
                                                    {"random", Routing::kRandom},
                                                    {"balanced", Routing::kBalanced}}) {
    const RunConfig c = parse_run_config("[model]\nrouting = \"" + text + "\"\n", "t.toml");
    EXPECT_EQ(c.model.routing, mode);
    const std::string toml = run_config_to_toml(c);
    EXPECT_NE(toml.find("routing = '" + text + "'"), std::string::npos) << toml;
    EXPECT_EQ(parse_run_config(toml, "again.toml").model.routing, mode);
    EXPECT_EQ(parse_run_config("", "t.toml", {"model.routing=" + text}).model.routing, mode);
  }
  try {
    parse_run_config("[model]\nrouting = \"uniform\"\n", "t.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.routing=\"uniform\" is not one of \"learned\", \"random\", "
                        "\"balanced\""),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}

TEST(RoutingModes, HfConfigClaimsNoArchitectureUnlessLearned) {
  ModelConfig c;  // OLMoE-like defaults
  c.vocab_size = 100;
  c.hidden_size = 64;
  EXPECT_EQ(io::hf_config_json(c, 128, std::nullopt).at("model_type"), "olmoe");
  for (const Routing mode : {Routing::kRandom, Routing::kBalanced}) {
    for (const QkNorm qk : {QkNorm::kFull, QkNorm::kPerHead}) {
      ModelConfig m = c;
      m.routing = mode;
      m.qk_norm = qk;
      const nlohmann::json j = io::hf_config_json(m, 128, std::nullopt);
      EXPECT_EQ(j.at("model_type"), "moecore");
      EXPECT_TRUE(j.at("architectures").empty());
      EXPECT_EQ(j.at("routing"), mode == Routing::kRandom ? "random" : "balanced");
    }
  }
}

}  // namespace
}  // namespace moecore
