// AdamW against a hand-written double version of torch.optim.AdamW, the LR schedule's end points,
// and global gradient-norm clipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numbers>
#include <utility>
#include <vector>

#include "dist/distributed_optimizer.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "optim/optim_config.h"

namespace moecore {
namespace {

using gradcheck::random_vec;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 7;
  c.hidden_size = 4;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.num_experts = 2;
  c.num_experts_per_tok = 1;
  c.moe_intermediate_size = 3;
  return c;
}

void fill(const ParamLayout& layout, ParamBuffers& b, uint32_t seed, float lo, float hi) {
  for (const ParamSpec& spec : layout.specs()) {
    const std::vector<float> v = random_vec(spec.numel, seed++, lo, hi);
    std::copy(v.begin(), v.end(), b.at(spec));
  }
}

// torch.optim.AdamW (single-tensor path) in double: decoupled decay first, then the Adam update
// with bias corrections, denominator sqrt(v) / sqrt(1 - b2^t) + eps.
struct RefAdamW {
  OptimConfig c;
  std::vector<double> m, v;
  int64_t t = 0;
  void step(std::vector<double>& p, const std::vector<float>& g, const std::vector<bool>& decay,
            double lr) {
    ++t;
    const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = static_cast<double>(g[i]);
      if (decay[i]) p[i] *= 1.0 - lr * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
      v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + c.eps);
    }
  }
};

TEST(Optim, AdamWTwoStepsMatchTorchFormula) {
  const ModelConfig mc = tiny_config();
  const ParamLayout layout = ParamLayout::build(mc);
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.beta1 = 0.9;
  oc.beta2 = 0.95;
  oc.eps = 1e-8;
  ParamBuffers params(layout), grads(layout);
  fill(layout, params, 1, -1.0f, 1.0f);

  // Flatten dense then expert, with the decay flag of each element.
  auto flat = [](const ParamBuffers& b) {
    std::vector<float> out = host_copy(b.dense);
    const std::vector<float> expert = host_copy(b.expert);
    out.insert(out.end(), expert.begin(), expert.end());
    return out;
  };
  std::vector<bool> decay(layout.numel(ParamGroup::kDense) + layout.numel(ParamGroup::kExpert));
  bool saw_norm = false, saw_embedding = false, saw_matrix = false;
  for (const ParamSpec& spec : layout.specs()) {
    const size_t base =
        (spec.group == ParamGroup::kDense ? 0 : layout.numel(ParamGroup::kDense)) + spec.offset;
    for (size_t i = 0; i < spec.numel; ++i) decay[base + i] = !spec.is_norm && !spec.is_embedding;
    saw_norm |= spec.is_norm;
    saw_embedding |= spec.is_embedding;
    saw_matrix |= !spec.is_norm && !spec.is_embedding;
  }
  ASSERT_TRUE(saw_norm && saw_embedding && saw_matrix);

  const std::vector<float> p0 = flat(params);
  std::vector<double> ref_p(p0.begin(), p0.end());
  RefAdamW ref{oc, std::vector<double>(p0.size(), 0.0), std::vector<double>(p0.size(), 0.0)};
  AdamW opt(layout, oc);
  const double lrs[] = {1e-2, 5e-3};
  for (int step = 0; step < 2; ++step) {
    fill(layout, grads, 100 + 50 * static_cast<uint32_t>(step), -1.0f, 1.0f);
    opt.step(params, grads, lrs[step]);
    ref.step(ref_p, flat(grads), decay, lrs[step]);
    EXPECT_EQ(opt.steps_taken(), step + 1);
    const std::vector<float> p = flat(params), m = flat(opt.exp_avg()), v = flat(opt.exp_avg_sq());
    double err_p = 0.0, err_m = 0.0, err_v = 0.0, moved = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      err_p = std::max(err_p, std::abs(static_cast<double>(p[i]) - ref_p[i]));
      err_m = std::max(err_m, std::abs(static_cast<double>(m[i]) - ref.m[i]));
      err_v = std::max(err_v, std::abs(static_cast<double>(v[i]) - ref.v[i]));
      moved = std::max(moved, std::abs(ref_p[i] - static_cast<double>(p0[i])));
    }
    ASSERT_GT(moved, 1e-3);
    // fp32 state: a few ulps of |p| <= ~1 (ulp 1.2e-7), of |m| <= 1 and |v| <= 1.
    EXPECT_LT(err_p, 1e-6) << "step " << step + 1;
    EXPECT_LT(err_m, 1e-6) << "step " << step + 1;
    EXPECT_LT(err_v, 1e-6) << "step " << step + 1;
  }
}

TEST(Optim, AdamWNoDecayOnNormsAndEmbeddingsWithZeroGrad) {
  // Zero gradient: only the decoupled decay moves parameters, and only the decayed ones.
  const ModelConfig mc = tiny_config();
  const ParamLayout layout = ParamLayout::build(mc);
  OptimConfig oc;
  oc.lr = 0.1;
  oc.weight_decay = 0.5;
  ParamBuffers params(layout), grads(layout);
  fill(layout, params, 3, 0.5f, 1.0f);
  const ParamBuffers before = params;
  AdamW opt(layout, oc);
  opt.step(params, grads, oc.lr);
  for (const ParamSpec& spec : layout.specs()) {
    const bool decay = !spec.is_norm && !spec.is_embedding;
    for (size_t i = 0; i < spec.numel; ++i) {
      const double b = static_cast<double>(before.at(spec)[i]);
      EXPECT_NEAR(static_cast<double>(params.at(spec)[i]), decay ? b * (1.0 - 0.05) : b, 1e-7)
          << spec.name;
    }
  }
}

// OLMo-core's schedulers at its step number t = step + 1 (its trainer counts the first update as
// 1).
// OLMo-core's WSD: linear warm-up through update `warmup`, the peak, then the last `decay` updates
// fall linearly to lr * min_lr_ratio (its decay_min_lr), reached at the last update.
TEST(Optim, LearningRateWsd) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.0;
  c.warmup_steps = 4;
  c.schedule = LrSchedule::kWsd;
  c.decay_steps = 5;
  const int64_t total = 20;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 2.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 1e-3);  // update 4: the warm-up's end
  for (int64_t step = 4; step < 14; ++step) EXPECT_EQ(learning_rate(c, step, total), 1e-3) << step;
  // Updates 15..20 (steps 14..19): (20 - t) / 5 of the peak, 0 at the last.
  EXPECT_EQ(learning_rate(c, 14, total), 1e-3);  // t = 15: 5 / 5
  EXPECT_DOUBLE_EQ(learning_rate(c, 15, total), 8e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 18, total), 2e-4);
  EXPECT_EQ(learning_rate(c, 19, total), 0.0);
  // Past the end (an update past train.max_tokens) the line goes on below the floor, as
  // OLMo-core's WSD.get_lr(lr, 31, 20) = lr x -11 / 5.
  EXPECT_DOUBLE_EQ(learning_rate(c, 30, total), 1e-3 * -11.0 / 5.0);
  // decay_fraction (steps 0: round(20 x 0.25) = 5, the same schedule); a floor of 10 %.
  c.decay_steps = 0;
  c.decay_fraction = 0.25;
  EXPECT_EQ(decay_length(c, total), 5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 15, total), 8e-4);
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(c, 19, total), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 16, total), 1e-4 + 9e-4 * 3.0 / 5.0);  // t = 17
}

// OLMo-core's WSDS: the warm-up takes the first period's start; each period holds its peak (lr x
// its multiplier) until its last `decay` units, which fall linearly to lr * min_lr_ratio, reached
// at the period's last update; the floor after the last period.
TEST(Optim, LearningRateWsds) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.0;
  c.warmup_steps = 2;
  c.schedule = LrSchedule::kWsds;
  c.decay_steps = 2;
  c.period_steps = {6, 4};
  c.period_lr_multipliers = {1.0, 0.5};
  const int64_t total = 20;  // not the schedule's length: its periods are
  const std::vector<double> expected = {5e-4, 1e-3, 1e-3,   1e-3, 5e-4, 0.0,  // period 0
                                        5e-4, 5e-4, 2.5e-4, 0.0,              // period 1
                                        0.0,  0.0};                           // after them
  for (size_t step = 0; step < expected.size(); ++step)
    EXPECT_DOUBLE_EQ(learning_rate(c, static_cast<int64_t>(step), total), expected[step]) << step;
  // A decay fraction is of each whole period (round(6 x 0.5) = 3, round(4 x 0.5) = 2), a floor.
  c.decay_steps = 0;
  c.decay_fraction = 0.5;
  c.min_lr_ratio = 0.1;
  c.period_lr_multipliers.clear();
  EXPECT_DOUBLE_EQ(learning_rate(c, 2, total), 1e-3);  // t = 3: the decay's first, the peak
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 1e-4 + 9e-4 * 2.0 / 3.0);  // t = 4
  EXPECT_DOUBLE_EQ(learning_rate(c, 5, total), 1e-4);                     // the period's end
  EXPECT_DOUBLE_EQ(learning_rate(c, 6, total), 1e-3);                     // period 1's peak
  EXPECT_DOUBLE_EQ(learning_rate(c, 8, total), 1e-4 + 9e-4 * 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 15, total), 1e-4);
}

// OLMo-core's ExponentialScheduler: lr_min (lr / lr_min)^(t / horizon), lr at the run's end.
TEST(Optim, LearningRateExponential) {
  OptimConfig c;
  c.lr = 1e-2;
  c.schedule = LrSchedule::kExponential;
  c.exponential_lr_min = 1e-6;
  const int64_t total = 4;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 1e-5);  // t = 1: 1e-6 x 1e4^(1/4)
  EXPECT_DOUBLE_EQ(learning_rate(c, 1, total), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 2, total), 1e-3);
  EXPECT_EQ(learning_rate(c, 3, total), 1e-2);
  EXPECT_EQ(learning_rate(c, 9, total), 1e-2);
}

// After a resume that changed the batch (origin: step 5 at 320 tokens, then 128 a step), a
// schedule in tokens is asked at the tokens seen over those plus the remaining updates' tokens:
// the rate a one-token-a-step run gives at that count and horizon. In steps, the origin is moot.
TEST(Optim, LearningRateInTokensFollowsTheTokensSeen) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.schedule = LrSchedule::kCosine;
  c.units = LrUnits::kTokens;
  c.warmup_tokens = 150;
  const TokenOrigin origin{5, 320};
  for (int64_t step = 5; step < 10; ++step) {
    const int64_t seen = 320 + (step + 1 - 5) * 128, horizon = 320 + (10 - 5) * 128;
    EXPECT_EQ(learning_rate(c, step, 10, 128, origin), learning_rate(c, seen - 1, horizon, 1))
        << step;
  }
  EXPECT_EQ(learning_rate(c, 7, 10, 64, {5, 320}), learning_rate(c, 7, 10, 64));  // no change
  c.units = LrUnits::kSteps;
  c.warmup_tokens = 0;
  c.warmup_steps = 2;
  EXPECT_EQ(learning_rate(c, 7, 10, 128, origin), learning_rate(c, 7, 10, 128));
}

// train.max_tokens is the horizon of a schedule in tokens, which the last update may pass: 600
// tokens in updates of 64 (10 updates, the last ending at 640). WSD's decay line goes on below
// its floor there, as OLMo-core's WSD.get_lr(lr, 640, 600) does (lr x (600 - 640) / 300); the
// cosine holds its floor. In updates the horizon stays the updates (max_steps_for_tokens's).
TEST(Optim, LearningRateOverMaxTokens) {
  OptimConfig c;
  c.lr = 3e-3;
  c.schedule = LrSchedule::kWsd;
  c.units = LrUnits::kTokens;
  c.warmup_steps = 0;
  c.warmup_tokens = 100;
  c.decay_tokens = 300;
  c.min_lr_ratio = 0.0;
  EXPECT_EQ(learning_rate(c, 8, 10, 64, {}, 600), 0.0 + (3e-3 - 0.0) * 24.0 / 300.0);   // 576
  EXPECT_EQ(learning_rate(c, 9, 10, 64, {}, 600), 0.0 + (3e-3 - 0.0) * -40.0 / 300.0);  // 640
  EXPECT_LT(learning_rate(c, 9, 10, 64, {}, 600), 0.0);
  // Without max_tokens the horizon is where the last update ends: the floor there.
  EXPECT_EQ(learning_rate(c, 9, 10, 64), 0.0);
  c.schedule = LrSchedule::kCosine;
  c.min_lr_ratio = 0.1;
  EXPECT_EQ(learning_rate(c, 9, 10, 64, {}, 600), 3e-3 * 0.1);
  EXPECT_GT(learning_rate(c, 8, 10, 64, {}, 600), 3e-3 * 0.1);
  // After a resume with another batch (origin: 5 updates, 320 tokens) the horizon is still 600:
  // update 7 has seen 320 + 2 x 128 = 576 tokens.
  EXPECT_EQ(learning_rate(c, 6, 8, 128, {5, 320}, 600), learning_rate(c, 575, 600, 1));
  c.units = LrUnits::kSteps;
  c.warmup_tokens = 0;
  c.warmup_steps = 2;
  EXPECT_EQ(learning_rate(c, 7, 10, 64, {}, 600), learning_rate(c, 7, 10, 64));
}

// OLMo-core's InvSqrtWithWarmup: warm-up below `warmup`, then lr_min + (lr - lr_min) sqrt(w / t),
// with no end of run (past max_steps it goes on falling).
TEST(Optim, LearningRateInvSqrt) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 4;
  c.schedule = LrSchedule::kInvSqrt;
  const int64_t total = 20;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 2.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 1e-3);                // t = 4: sqrt(4 / 4)
  EXPECT_DOUBLE_EQ(learning_rate(c, 15, total), 1e-4 + 9e-4 * 0.5);  // t = 16
  EXPECT_DOUBLE_EQ(learning_rate(c, 19, total), 1e-4 + 9e-4 * std::sqrt(0.2));  // t = 20: no floor
  EXPECT_LT(learning_rate(c, 99, total), learning_rate(c, 19, total));
}

// OLMo-core's HalfCosWithWarmup: the warm-up rises to (lr + lr_min) / 2, then the second half of a
// cosine over twice the rest of the run falls from there to lr_min.
TEST(Optim, LearningRateHalfCosine) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 4;
  c.schedule = LrSchedule::kHalfCosine;
  const int64_t total = 20;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 5.5e-4 / 4.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 5.5e-4);  // t = 4: cos(pi / 2)
  const double pi = std::numbers::pi;
  EXPECT_DOUBLE_EQ(learning_rate(c, 11, total), 1e-4 + 9e-4 * (1.0 + std::cos(pi * 0.75)) / 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 19, total), 1e-4);
}

// OLMo-core's CosWithWarmupAndLinearDecay: the cosine (to lr * min_lr_ratio over the run) until the
// last `decay` updates, which fall linearly from its rate at their first to lr *
// decay_min_lr_ratio at the last update.
TEST(Optim, LearningRateCosineLinearDecay) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 4;
  c.decay_steps = 5;
  c.schedule = LrSchedule::kCosineLinearDecay;
  OptimConfig cosine = c;
  cosine.schedule = LrSchedule::kCosine;
  const int64_t total = 20;
  for (int64_t step = 0; step < 14; ++step)
    EXPECT_EQ(learning_rate(c, step, total), learning_rate(cosine, step, total)) << step;
  // t = 15, the tail's first update: the cosine 11 of its 16 updates in.
  const double from = 1e-4 + 9e-4 * (1.0 + std::cos(std::numbers::pi * 11.0 / 16.0)) / 2.0;
  EXPECT_DOUBLE_EQ(learning_rate(cosine, 14, total), from);
  EXPECT_DOUBLE_EQ(learning_rate(c, 14, total), from);
  EXPECT_DOUBLE_EQ(learning_rate(c, 16, total), from * 3.0 / 5.0);
  EXPECT_EQ(learning_rate(c, 19, total), 0.0);
  c.decay_min_lr_ratio = 0.02;
  EXPECT_DOUBLE_EQ(learning_rate(c, 16, total), 2e-5 + (from - 2e-5) * 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 19, total), 2e-5);
}

// OLMo-core's PowerLR: warm-up through update `warmup`, then lr (t / warmup)^b, then the last
// `decay` updates fall linearly from the law's rate at their first to lr * min_lr_ratio.
TEST(Optim, LearningRatePower) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.0;
  c.warmup_steps = 4;
  c.decay_steps = 5;
  c.power_exponent = -0.5;
  c.schedule = LrSchedule::kPower;
  const int64_t total = 20;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 2.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 1e-3);              // t = 4
  EXPECT_DOUBLE_EQ(learning_rate(c, 8, total), 1e-3 * 2.0 / 3.0);  // t = 9: (9 / 4)^-1/2
  const double tail = 1e-3 * std::pow(15.0 / 4.0, -0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 15, total), tail * 4.0 / 5.0);  // t = 16
  EXPECT_EQ(learning_rate(c, 19, total), 0.0);
}

// units "tokens" (OLMo-core's SchedulerUnits.tokens): update `step` is asked at its tokens seen,
// (step + 1) x tokens_per_step, of max_steps x tokens_per_step; the lengths are in tokens.
TEST(Optim, LearningRateInTokens) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.0;
  c.schedule = LrSchedule::kWsd;
  c.units = LrUnits::kTokens;
  c.warmup_tokens = 100;  // the first update (64 tokens) is 64 / 100 of the way up
  c.decay_tokens = 160;
  const int64_t total = 10, tokens = 64;  // a run of 640 tokens
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total, tokens), 1e-3 * 64.0 / 100.0);
  EXPECT_EQ(learning_rate(c, 1, total, tokens), 1e-3);  // 128 tokens: past the warm-up
  EXPECT_EQ(learning_rate(c, 6, total, tokens), 1e-3);  // 448 < 640 - 160
  EXPECT_DOUBLE_EQ(learning_rate(c, 7, total, tokens), 1e-3 * 128.0 / 160.0);  // 512: 128 to go
  EXPECT_EQ(learning_rate(c, 9, total, tokens), 0.0);
  c.warmup_tokens = 0;
  c.warmup_fraction = 0.15;  // round(640 x 0.15) = 96 tokens, not round(10 x 0.15) = 2 updates
  EXPECT_EQ(warmup_length(c, total * tokens), 96);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total, tokens), 1e-3 * 64.0 / 96.0);
  EXPECT_THROW(learning_rate(c, 0, total), Error);  // tokens without an update's tokens
}

// warmup_fraction and decay_fraction round as Python's round does (OLMo-core's schedulers): to
// the nearest integer, ties to even.
TEST(Optim, ScheduleFractionsRoundHalfToEven) {
  OptimConfig c;
  c.warmup_fraction = 0.25;
  EXPECT_EQ(warmup_length(c, 10), 2);  // 2.5 -> 2
  c.warmup_fraction = 0.35;
  EXPECT_EQ(warmup_length(c, 10), 4);  // 3.5 -> 4
  c.warmup_fraction = 0.26;
  EXPECT_EQ(warmup_length(c, 10), 3);  // 2.6 -> 3
  c.decay_fraction = 0.05;
  EXPECT_EQ(decay_length(c, 10), 0);  // 0.5 -> 0 (the config refuses this for WSD)
  c.decay_fraction = 0.15;
  EXPECT_EQ(decay_length(c, 10), 2);  // 1.5 -> 2
  c.decay_steps = 7;
  EXPECT_EQ(decay_length(c, 10), 7);  // decay_steps wins
  c.warmup_fraction = 0.0;
  c.warmup_steps = 3;
  EXPECT_EQ(warmup_length(c, 10), 3);
}

TEST(Optim, LearningRateWarmupAndEndPoints) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 10;
  const int64_t total = 110;
  for (LrSchedule s : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kConstant}) {
    c.schedule = s;
    EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 1e-4);
    EXPECT_DOUBLE_EQ(learning_rate(c, 4, total), 5e-4);
    EXPECT_DOUBLE_EQ(learning_rate(c, 9, total), 1e-3);  // the warm-up's last update: the peak
    if (s != LrSchedule::kConstant) {
      EXPECT_LT(learning_rate(c, 10, total), 1e-3);  // decaying
    }
    const double end = s == LrSchedule::kConstant ? 1e-3 : 1e-4;
    EXPECT_NEAR(learning_rate(c, total - 1, total), end, 1e-15);    // the last update: the end
    EXPECT_NEAR(learning_rate(c, total + 50, total), end, 1e-15);   // clamped past the end
    const double mid = s == LrSchedule::kConstant ? 1e-3 : 5.5e-4;  // half way: (lr + min) / 2
    EXPECT_NEAR(learning_rate(c, 59, total), mid, 1e-15);
  }
  // Cosine a quarter of the way: min + (lr - min) * (1 + cos(pi / 4)) / 2.
  c.schedule = LrSchedule::kCosine;
  EXPECT_NEAR(learning_rate(c, 34, total),
              1e-4 + 9e-4 * 0.5 * (1.0 + std::cos(3.14159265358979323846 / 4.0)), 1e-15);
  // No warm-up: the first update is OLMo-core's step 1, one step into the decay.
  c.warmup_steps = 0;
  EXPECT_NEAR(learning_rate(c, 0, total),
              1e-4 + 9e-4 * 0.5 * (1.0 + std::cos(3.14159265358979323846 / 110.0)), 1e-15);
}

TEST(Optim, ClipGradNorm) {
  const ModelConfig mc = tiny_config();
  const ParamLayout layout = ParamLayout::build(mc);
  ParamBuffers grads(layout);
  fill(layout, grads, 7, -1.0f, 1.0f);
  double sq = 0.0;
  for (float g : grads.dense.span()) sq += static_cast<double>(g) * static_cast<double>(g);
  for (float g : grads.expert.span()) sq += static_cast<double>(g) * static_cast<double>(g);
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 2.0);
  EXPECT_NEAR(global_grad_norm(grads), norm, 1e-9 * norm);

  // Under the limit, and max_norm <= 0: untouched, the norm is still returned.
  for (double max_norm : {norm * 2.0, 0.0, -1.0}) {
    ParamBuffers g = grads;
    EXPECT_NEAR(clip_grad_norm(g, max_norm), norm, 1e-9 * norm);
    EXPECT_EQ(host_copy(g.dense), host_copy(grads.dense));
    EXPECT_EQ(host_copy(g.expert), host_copy(grads.expert));
  }

  // Over the limit: every gradient scaled by max / (norm + 1e-6).
  const double max_norm = 1.0;
  ParamBuffers g = grads;
  EXPECT_NEAR(clip_grad_norm(g, max_norm), norm, 1e-9 * norm);
  const double coef = max_norm / (norm + 1e-6);
  for (const auto& [out, in] : {std::pair{&g.dense, &grads.dense}, {&g.expert, &grads.expert}})
    for (size_t i = 0; i < in->size(); ++i)
      EXPECT_NEAR(static_cast<double>(out->span()[i]), coef * static_cast<double>(in->span()[i]),
                  1e-7);
  EXPECT_NEAR(global_grad_norm(g), max_norm, 1e-6);
}

// The step decided where the gradients are (kernels::step_decision) in one process: the
// optimizer's squares are the gradients' (no host read), an applied step clipped by the decision
// equals AdamW with the same clipping coefficient, and a skipped one leaves weights and moments as
// they were and its count undone, so that the next step's bias correction is the skipped one's.
TEST(Optim, TheStepDecidedWhereTheGradientsAreAppliesOrSkipsIt) {
  const ModelConfig mc = tiny_config();
  const ParamLayout layout = ParamLayout::build(mc);
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  OptimConfig oc;
  oc.max_grad_norm = 0.5;
  ParamBuffers params(layout), grads(layout);
  fill(layout, params, 3, -1.0f, 1.0f);
  fill(layout, grads, 7, -1.0f, 1.0f);
  const double norm = global_grad_norm(grads);
  ASSERT_GT(norm, 1.0);
  Workspace scratch;
  auto decide = [&](dist::DistributedOptimizer& opt, double norm_limit,
                    std::array<float, 2>& factors) {
    const std::array<double, kernels::kLossParts> row{2.0, 1.0, 0.5, 20.0};
    std::array<double, 3> decision{};
    const StepDecisionOptions options{.max_grad_norm = oc.max_grad_norm,
                                      .loss_limit = 10.0,
                                      .norm_limit = norm_limit,
                                      .lb_coef = 0.01,
                                      .z_coef = 0.001,
                                      .lm_z_coef = 1e-4,
                                      .loss_scale = 1.0};
    const ConstTensorView squares = opt.reduce_gradients(grads, scratch);
    kernels::step_decision(view(row.data(), {1, kernels::kLossParts}), squares, options,
                           ConstTensorView(), view(decision.data(), {3}),
                           view(factors.data(), {2}));
    EXPECT_NEAR(decision[1], norm, 1e-12 * norm);
    return decision[2] == 1.0;
  };

  // Applied: as AdamW's own step with the clipping coefficient.
  dist::DistributedOptimizer applied(layout, oc, mesh, false);
  ParamBuffers p_applied = params;
  std::array<float, 2> factors{};
  ASSERT_TRUE(decide(applied, norm, factors));
  EXPECT_EQ(factors[0], clip_coefficient(oc.max_grad_norm, norm));
  applied.stage_step(std::vector<double>{1e-3});
  applied.step(p_applied, grads, view(factors.data(), {2}), scratch);
  EXPECT_EQ(applied.steps_taken(), 1);
  AdamW reference(layout, oc);
  ParamBuffers p_reference = params;
  reference.step(p_reference, grads, 1e-3, clip_coefficient(oc.max_grad_norm, norm));
  EXPECT_EQ(host_copy(p_applied.dense), host_copy(p_reference.dense));
  EXPECT_EQ(host_copy(p_applied.expert), host_copy(p_reference.expert));

  // Skipped (the norm over its limit): nothing moves, and the count goes back.
  dist::DistributedOptimizer skipped(layout, oc, mesh, false);
  ParamBuffers p_skipped = params;
  ASSERT_FALSE(decide(skipped, norm * 0.5, factors));
  skipped.stage_step(std::vector<double>{1e-3});
  skipped.step(p_skipped, grads, view(factors.data(), {2}), scratch);
  skipped.skipped_step();
  EXPECT_EQ(skipped.steps_taken(), 0);
  EXPECT_EQ(host_copy(p_skipped.dense), host_copy(params.dense));
  EXPECT_EQ(host_copy(p_skipped.expert), host_copy(params.expert));
  for (const StatePiece& piece : skipped.checkpoint_state())
    for (size_t i = 0; i < piece.count; ++i) {
      ASSERT_EQ(piece.exp_avg[i], 0.0f);
      ASSERT_EQ(piece.exp_avg_sq[i], 0.0f);
    }
  // The next, applied step is the skipped one's first: the same as the first applied above.
  ASSERT_TRUE(decide(skipped, norm, factors));
  skipped.stage_step(std::vector<double>{1e-3});
  skipped.step(p_skipped, grads, view(factors.data(), {2}), scratch);
  EXPECT_EQ(host_copy(p_skipped.dense), host_copy(p_applied.dense));
  EXPECT_EQ(host_copy(p_skipped.expert), host_copy(p_applied.expert));
}

}  // namespace
}  // namespace moecore
