// MoE diagnostics from a real forward pass of a tiny transformer: route counts, load imbalance,
// router entropy, selected mass and the load-balancing loss, checked against direct computations
// from the router state, plus the names the metrics sink receives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/params.h"
#include "model/transformer.h"
#include "train/moe_metrics.h"

namespace moecore {
namespace {

ModelConfig tiny_model(RouterScore score) {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.intermediate_size = 12;
  c.first_k_dense_replace = 1;  // layer 0 dense, layers 1 and 2 MoE
  c.router_score = score;
  c.lb_loss_style = LbLossStyle::kOlmoCore;
  return c;
}

struct Forward {
  explicit Forward(const ModelConfig& config)
      : layout(ParamLayout::build(config)), params(layout), model(config, layout) {
    init_params(layout, 99, params);
    // Larger router weights than init_params' N(0, 0.02), so routing is visibly unbalanced.
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = config.first_k_dense_replace; i < config.num_hidden_layers; ++i) {
      const ParamSpec* router =
          layout.find("model.layers." + std::to_string(i) + ".mlp.gate.weight");
      EXPECT_NE(router, nullptr);
      float* w = params.at(*router);
      for (size_t j = 0; j < router->numel; ++j) w[j] = normal(rng);
    }
    std::vector<int32_t> tokens(static_cast<size_t>(kBatch * kSeq)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + 3) % static_cast<size_t>(config.vocab_size));
      targets[i] = static_cast<int32_t>((i * 5 + 1) % static_cast<size_t>(config.vocab_size));
    }
    loss = model.forward(params, tokens.data(), targets.data(), kBatch, kSeq);
  }

  static constexpr int64_t kBatch = 2, kSeq = 12;
  ParamLayout layout;
  ParamBuffers params;
  Transformer model;
  LossParts loss;
};

void check_metrics(RouterScore score) {
  const ModelConfig config = tiny_model(score);
  Forward f(config);
  const MoeMetrics m = compute_moe_metrics(f.model);
  const int64_t tokens = Forward::kBatch * Forward::kSeq;
  const int64_t e_count = config.num_experts, k = config.num_experts_per_tok;
  const double n = static_cast<double>(tokens);

  ASSERT_EQ(m.layers.size(), 2u);
  double lb_sum = 0.0, z_sum = 0.0;
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const MoeLayerMetrics& lm = m.layers[li];
    EXPECT_EQ(lm.layer, static_cast<int64_t>(li) + 1);
    const RouterState* st = f.model.router_state(lm.layer);
    ASSERT_NE(st, nullptr);
    const std::vector<float> scores = host_copy(st->scores);
    const std::vector<int32_t> topk_index = host_copy(st->topk_index);

    ASSERT_EQ(lm.tokens_per_expert.size(), static_cast<size_t>(e_count));
    EXPECT_EQ(std::accumulate(lm.tokens_per_expert.begin(), lm.tokens_per_expert.end(), int64_t{0}),
              tokens * k);
    // The counts agree with the top-k choices themselves.
    std::vector<int64_t> counted(static_cast<size_t>(e_count), 0);
    for (int32_t e : topk_index) ++counted[static_cast<size_t>(e)];
    EXPECT_EQ(lm.tokens_per_expert, counted);

    const int64_t max_count = *std::max_element(counted.begin(), counted.end());
    const double mean_count = static_cast<double>(tokens * k) / static_cast<double>(e_count);
    EXPECT_DOUBLE_EQ(lm.load_imbalance, static_cast<double>(max_count) / mean_count);
    EXPECT_GE(lm.load_imbalance, 1.0);

    EXPECT_GE(lm.router_entropy, 0.0);
    EXPECT_LE(lm.router_entropy, std::log(static_cast<double>(e_count)) + 1e-12);
    EXPECT_GT(lm.selected_mass, 0.0);
    EXPECT_LE(lm.selected_mass, static_cast<double>(k) + 1e-9);
    EXPECT_EQ(lm.drop_rate, 0.0);

    // lb = (E/k) sum_e f_e P_e with f_e = counts_e / N, P_e = mean_t scores[t, e] (a sigmoid
    // router's scores divided by their sum over the experts first, as OLMo-core does).
    double lb = 0.0, mass = 0.0;
    auto row_sum = [&](int64_t t) {
      if (score != RouterScore::kSigmoid) return 1.0;
      double sum = 0.0;
      for (int64_t e = 0; e < e_count; ++e)
        sum += static_cast<double>(scores[static_cast<size_t>(t * e_count + e)]);
      return sum;
    };
    for (int64_t e = 0; e < e_count; ++e) {
      double p = 0.0;
      for (int64_t t = 0; t < tokens; ++t)
        p += static_cast<double>(scores[static_cast<size_t>(t * e_count + e)]) / row_sum(t);
      lb += static_cast<double>(counted[static_cast<size_t>(e)]) / n * (p / n);
    }
    lb *= static_cast<double>(e_count) / static_cast<double>(k);
    EXPECT_NEAR(lm.lb_loss, lb, 1e-12 * std::max(1.0, lb));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = topk_index[static_cast<size_t>(t * k + j)];
        mass += static_cast<double>(scores[static_cast<size_t>(t * e_count + e)]);
      }
    EXPECT_NEAR(lm.selected_mass, mass / n, 1e-12);
    lb_sum += lm.lb_loss;
    z_sum += lm.z_loss;
  }
  // The model's own loss parts are the same quantities summed over MoE layers.
  EXPECT_NEAR(f.loss.lb, lb_sum, 1e-7 * std::max(1.0, lb_sum));
  EXPECT_NEAR(f.loss.z, z_sum, 1e-5 * std::max(1.0, z_sum));

  EXPECT_DOUBLE_EQ(m.mean_load_imbalance,
                   (m.layers[0].load_imbalance + m.layers[1].load_imbalance) / 2.0);
  EXPECT_DOUBLE_EQ(m.max_load_imbalance,
                   std::max(m.layers[0].load_imbalance, m.layers[1].load_imbalance));
  EXPECT_DOUBLE_EQ(m.mean_router_entropy,
                   (m.layers[0].router_entropy + m.layers[1].router_entropy) / 2.0);
  EXPECT_DOUBLE_EQ(m.mean_selected_mass,
                   (m.layers[0].selected_mass + m.layers[1].selected_mass) / 2.0);
}

TEST(MoeMetrics, SoftmaxRouterOnForward) {
  check_metrics(RouterScore::kSoftmax);
}

TEST(MoeMetrics, SigmoidRouterOnForward) {
  check_metrics(RouterScore::kSigmoid);
}

TEST(MoeMetrics, EntropyOfUniformRouterIsLogE) {
  const ModelConfig config = tiny_model(RouterScore::kSoftmax);
  const ParamLayout layout = ParamLayout::build(config);
  ParamBuffers params(layout);
  init_params(layout, 3, params);
  for (int64_t i = 1; i < config.num_hidden_layers; ++i) {
    const ParamSpec* router = layout.find("model.layers." + std::to_string(i) + ".mlp.gate.weight");
    ASSERT_NE(router, nullptr);
    std::fill(params.at(*router), params.at(*router) + router->numel, 0.0f);
  }
  Transformer model(config, layout);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  model.forward(params, tokens.data(), nullptr, 1, 8);
  const MoeMetrics m = compute_moe_metrics(model);
  ASSERT_EQ(m.layers.size(), 2u);
  for (const MoeLayerMetrics& lm : m.layers) {
    EXPECT_NEAR(lm.router_entropy, std::log(6.0), 1e-6);
    EXPECT_NEAR(lm.selected_mass, 2.0 / 6.0, 1e-6);
    EXPECT_NEAR(lm.z_loss, std::log(6.0) * std::log(6.0), 1e-5);
  }
}

TEST(MoeMetrics, EmptyBeforeForward) {
  const ModelConfig config = tiny_model(RouterScore::kSoftmax);
  const ParamLayout layout = ParamLayout::build(config);
  Transformer model(config, layout);
  const MoeMetrics m = compute_moe_metrics(model);
  EXPECT_TRUE(m.layers.empty());
  EXPECT_EQ(m.mean_load_imbalance, 0.0);
  EXPECT_EQ(m.scalars(true).size(), 5u);
}

TEST(MoeMetrics, ScalarNames) {
  const ModelConfig config = tiny_model(RouterScore::kSoftmax);
  Forward f(config);
  const MoeMetrics m = compute_moe_metrics(f.model);

  std::vector<std::string> expected = {"moe/load_imbalance", "moe/max_load_imbalance",
                                       "moe/router_entropy", "moe/selected_mass", "moe/drop_rate"};
  for (int layer : {1, 2})
    for (const char* metric :
         {"load_imbalance", "lb_loss", "z_loss", "router_entropy", "selected_mass", "drop_rate"})
      expected.push_back("moe/layer" + std::to_string(layer) + "/" + metric);
  std::vector<std::string> got;
  for (const auto& [name, value] : m.scalars(false)) {
    got.push_back(name);
    EXPECT_TRUE(std::isfinite(value)) << name;
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m.scalars(false)[0].second, m.mean_load_imbalance);

  const auto with_counts = m.scalars(true);
  EXPECT_EQ(with_counts.size(), expected.size() + 2u * 6u);
  std::set<std::string> names;
  for (const auto& [name, value] : with_counts) names.insert(name);
  EXPECT_EQ(names.size(), with_counts.size());  // no duplicates
  EXPECT_TRUE(names.count("moe/layer1/tokens_expert0"));
  EXPECT_TRUE(names.count("moe/layer2/tokens_expert5"));
  double counts = 0.0;
  for (const auto& [name, value] : with_counts)
    if (name.rfind("moe/layer2/tokens_expert", 0) == 0) counts += value;
  EXPECT_EQ(counts, static_cast<double>(Forward::kBatch * Forward::kSeq * 2));
}

}  // namespace
}  // namespace moecore
