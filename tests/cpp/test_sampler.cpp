// Sampler: greedy and its equivalents, determinism per seed, the distribution after temperature /
// top-k / top-p, and empirical frequencies against a known distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/check.h"
#include "model/sampler.h"

namespace moecore {
namespace {

SamplingConfig with(double temperature, int64_t top_k, double top_p, uint64_t seed) {
  SamplingConfig c;
  c.temperature = temperature;
  c.top_k = top_k;
  c.top_p = top_p;
  c.seed = seed;
  return c;
}

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(Sampler, GreedyIsArgmaxWithTiesToLowestId) {
  Sampler greedy(with(0.0, 0, 1.0, 0));
  EXPECT_EQ(greedy.sample({0.5f, -1.0f, 2.0f, 1.0f}), 2);
  EXPECT_EQ(greedy.sample({1.0f, 3.0f, 3.0f, 0.0f}), 1);
  EXPECT_EQ(greedy.sample({-INFINITY, -5.0f, -INFINITY}), 1);
  EXPECT_EQ(argmax({1.0f, 3.0f, 3.0f}), 1);
  const std::vector<double> p = greedy.probabilities({1.0f, 3.0f, 3.0f});
  EXPECT_EQ(p, (std::vector<double>{0.0, 1.0, 0.0}));
}

TEST(Sampler, TopK1AndTinyTopPAreGreedyWithoutTies) {
  const std::vector<std::vector<float>> cases = {{0.5f, -1.0f, 2.0f, 1.9f},
                                                 {1.0f, 3.0f, 2.0f, 0.0f}};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Sampler top_k(with(1.0, 1, 1.0, seed));
    Sampler top_p(with(1.0, 0, 1e-9, seed));
    Sampler hot_top_k(with(50.0, 1, 1.0, seed));
    for (const auto& logits : cases) {
      const int32_t expected = argmax(logits);
      EXPECT_EQ(top_k.sample(logits), expected);
      EXPECT_EQ(top_p.sample(logits), expected);
      EXPECT_EQ(hot_top_k.sample(logits), expected);
    }
  }
}

// Ties at the filters' boundaries, as transformers 4.57's warpers (TopKLogitsWarper,
// TopPLogitsWarper, min_tokens_to_keep 1) decide them; the expected distributions are theirs
// (torch.softmax of the warped float32 scores, printed to 6 digits).
TEST(Sampler, TiesAtTheTopKAndTopPBoundariesAsTransformers) {
  const auto expect_distribution = [](const SamplingConfig& config,
                                      const std::vector<float>& logits,
                                      const std::vector<double>& expected) {
    const std::vector<double> got = Sampler(config).probabilities(logits);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << "token " << i;
  };
  // top-k keeps every token tied with the k-th.
  expect_distribution(with(1.0, 1, 1.0, 0), {2, 2, 0, -1}, {0.5, 0.5, 0, 0});
  expect_distribution(with(1.0, 2, 1.0, 0), {3, 1, 1, 1, 0},
                      {0.711235, 0.096255, 0.096255, 0.096255, 0});
  // top-p drops tied tokens lowest id first (a stable ascending sort).
  expect_distribution(with(1.0, 0, 0.5, 0), {0, 0, 0, 0}, {0, 0, 0.5, 0.5});
  expect_distribution(with(1.0, 0, 0.5, 0), {std::log(4.0f), std::log(3.0f), std::log(3.0f)},
                      {0.571429, 0, 0.428571});
  expect_distribution(with(1.0, 0, 1e-9, 0), {1, 3, 3, 0}, {0, 0, 1, 0});
  expect_distribution(with(1.0, 1, 0.6, 0), {1, 3, 3, 0}, {0, 0.5, 0.5, 0});
  expect_distribution(with(1.0, 2, 0.5, 0), {5, 4, 4, 4, 1}, {0.731059, 0, 0, 0.268941, 0});
  // Both tied tokens are drawn under top-k = 1.
  std::set<int32_t> drawn;
  Sampler top_k(with(1.0, 1, 1.0, 11));
  for (int i = 0; i < 64; ++i) drawn.insert(top_k.sample({1, 3, 3, 0}));
  EXPECT_EQ(drawn, (std::set<int32_t>{1, 2}));
}

// A temperature so small that 1 / temperature overflows (a subnormal double) is the limit of the
// distribution, the argmax with ties shared, never NaN.
TEST(Sampler, ASubnormalTemperatureIsTheLimitNotNaN) {
  for (double t : {1e-300, 1e-310, 5e-324}) {
    const std::vector<double> got = Sampler(with(t, 0, 1.0, 0)).probabilities({1, 3, 3, 0});
    EXPECT_EQ(got, (std::vector<double>{0, 0.5, 0.5, 0})) << "T=" << t;
    Sampler s(with(t, 0, 0.9, 1));
    for (int i = 0; i < 8; ++i) EXPECT_EQ(s.sample({1, 3, 2, 0}), 1) << "T=" << t;
  }
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedsDiffer) {
  const std::vector<float> flat(16, 0.0f);
  auto draw = [&](uint64_t seed) {
    Sampler s(with(1.0, 0, 1.0, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(flat));
    return out;
  };
  EXPECT_EQ(draw(1), draw(1));
  EXPECT_NE(draw(1), draw(2));
  EXPECT_NE(draw(0), draw(1));
  const std::vector<int32_t> seq = draw(5);
  EXPECT_GT(std::set<int32_t>(seq.begin(), seq.end()).size(), 8u);  // a flat draw covers the vocab

  // Portable RNG: SplitMix64's published first output for seed 0.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  const double u = SplitMix64(123).next_double();
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

TEST(Sampler, EmpiricalFrequenciesMatchTheDistribution) {
  // p = (0.1, 0.2, 0.3, 0.4); 40000 draws: the binomial standard deviation is at most
  // sqrt(0.24 / 40000) ~= 0.0025, so 0.01 is a 4-sigma tolerance (and the seed is fixed).
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> logits = log_probs(p);
  Sampler s(with(1.0, 0, 1.0, 2024));
  const int draws = 40000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(s.sample(logits))];
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(counts[i] / static_cast<double>(draws), p[i], 0.01) << "token " << i;

  // Through top-k = 3: token 0 never appears, the rest renormalise to 2/9, 3/9, 4/9.
  Sampler k3(with(1.0, 3, 1.0, 7));
  std::vector<int> kcounts(4, 0);
  for (int i = 0; i < draws; ++i) ++kcounts[static_cast<size_t>(k3.sample(logits))];
  EXPECT_EQ(kcounts[0], 0);
  for (size_t i = 1; i < p.size(); ++i)
    EXPECT_NEAR(kcounts[i] / static_cast<double>(draws), p[i] / 0.9, 0.01) << "token " << i;
}

TEST(Sampler, TemperatureTopKTopPDistribution) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> logits = log_probs(p);
  for (double t : {0.5, 1.0, 2.0}) {
    const std::vector<double> got = Sampler(with(t, 0, 1.0, 0)).probabilities(logits);
    double z = 0.0;
    for (double x : p) z += std::pow(x, 1.0 / t);
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_NEAR(got[i], std::pow(p[i], 1.0 / t) / z, 1e-6) << "T=" << t << " token " << i;
  }
  // Lower temperature sharpens, higher flattens.
  EXPECT_GT(Sampler(with(0.5, 0, 1.0, 0)).probabilities(logits)[3], 0.4 + 1e-3);
  EXPECT_LT(Sampler(with(2.0, 0, 1.0, 0)).probabilities(logits)[3], 0.4 - 1e-3);

  // top-k = 2 keeps tokens 3 and 2.
  std::vector<double> got = Sampler(with(1.0, 2, 1.0, 0)).probabilities(logits);
  EXPECT_NEAR(got[3], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(got[2], 3.0 / 7.0, 1e-6);
  EXPECT_EQ(got[0] + got[1], 0.0);
  // top-p = 0.5: 0.4 < 0.5, 0.4 + 0.3 >= 0.5 -> {3, 2}; top-p = 0.4 keeps {3} alone.
  got = Sampler(with(1.0, 0, 0.5, 0)).probabilities(logits);
  EXPECT_NEAR(got[3], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(got[2], 3.0 / 7.0, 1e-6);
  got = Sampler(with(1.0, 0, 0.39, 0)).probabilities(logits);
  EXPECT_EQ(got[3], 1.0);
  // top-k then top-p: top-k = 3 gives (2/9, 3/9, 4/9); top-p = 0.6 -> 4/9 < 0.6 <= 7/9 -> {3, 2}.
  got = Sampler(with(1.0, 3, 0.6, 0)).probabilities(logits);
  EXPECT_NEAR(got[3], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(got[2], 3.0 / 7.0, 1e-6);
  EXPECT_EQ(got[1], 0.0);
  // Masked (-inf) tokens are never drawn.
  Sampler s(with(1.0, 0, 1.0, 3));
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.sample({0.0f, -INFINITY, 0.0f}), 1);
}

TEST(Sampler, InvalidInputsAreErrors) {
  EXPECT_THROW(Sampler(with(-1.0, 0, 1.0, 0)), Error);
  EXPECT_THROW(Sampler(with(1.0, -1, 1.0, 0)), Error);
  EXPECT_THROW(Sampler(with(1.0, 0, 0.0, 0)), Error);
  EXPECT_THROW(Sampler(with(1.0, 0, 1.5, 0)), Error);
  Sampler s(with(1.0, 0, 1.0, 0));
  EXPECT_THROW(s.sample({}), Error);
  EXPECT_THROW(s.sample({0.0f, NAN}), Error);
  EXPECT_THROW(s.sample({-INFINITY, -INFINITY}), Error);
}

}  // namespace
}  // namespace moecore
