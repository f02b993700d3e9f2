// RoPE: forward against a double-precision reference of the HF rotate_half formula, backward
// against finite differences, and the structural properties (identity at position 0, norms).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/check.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "model/rope.h"

namespace moecore {
namespace {

using gradcheck::random_vec;  // uniform in [-1, 1)
using gradcheck::to_double;

// Plain reference in double, written from the HF formula independently of the table:
// out[i] = x[i] cos - x[i+h] sin, out[i+h] = x[i+h] cos + x[i] sin, angle = t / theta^(2i/hd).
std::vector<double> reference_rope(const std::vector<double>& x, int64_t batch, int64_t seq,
                                   int64_t n_heads, int64_t hd, double theta) {
  std::vector<double> out(x.size());
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t base = ((b * seq + t) * n_heads + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double angle =
              static_cast<double>(t) / std::pow(theta, static_cast<double>(2 * i) / hd);
          const double c = std::cos(angle), s = std::sin(angle);
          const double lo = x[base + i], hi = x[base + i + half];
          out[base + i] = lo * c - hi * s;
          out[base + i + half] = hi * c + lo * s;
        }
      }
  return out;
}

TEST(Rope, TableMatchesHfFloatFormula) {
  // The table must hold cos/sin of the float32 angle HF computes (float inv_freq times float t),
  // which for large t differs from the exact angle by far more than a float ulp of cos.
  const int64_t hd = 64, max_pos = 4096;
  const double theta = 500000.0;
  const RopeTable table = RopeTable::build(max_pos, hd, theta);
  ASSERT_EQ(table.cos.size(), static_cast<size_t>(max_pos * hd / 2));
  const std::vector<float> cos = host_copy(table.cos), sin = host_copy(table.sin);
  ASSERT_EQ(table.sin.size(), table.cos.size());
  double max_err = 0.0;
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{1000}, max_pos - 1}) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const float inv_freq = 1.0f / std::pow(static_cast<float>(theta),
                                             static_cast<float>(2 * i) / static_cast<float>(hd));
      const double angle = static_cast<double>(static_cast<float>(t) * inv_freq);
      max_err =
          std::max(max_err, std::abs(static_cast<double>(cos[t * hd / 2 + i]) - std::cos(angle)));
      max_err =
          std::max(max_err, std::abs(static_cast<double>(sin[t * hd / 2 + i]) - std::sin(angle)));
    }
  }
  // Rounding of cos/sin to float: half an ulp of a value in [-1, 1].
  EXPECT_LE(max_err, 6e-8);
}

TEST(Rope, ForwardMatchesDoubleReference) {
  const int64_t B = 2, T = 9, H = 3, hd = 16;
  const double theta = 10000.0;
  const RopeTable table = RopeTable::build(32, hd, theta);
  std::vector<float> x = random_vec(B * T * H * hd, 1);
  const std::vector<double> ref = reference_rope(to_double(x), B, T, H, hd, theta);
  kernels::rope_forward(view(x.data(), {B, T, H, hd}), table.cos_view(), table.sin_view(), 0);
  double max_err = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    max_err = std::max(max_err, std::abs(static_cast<double>(x[i]) - ref[i]));
  // |x| <= 1: absolute error of float cos/sin/angle (few ulp at t < 10) plus two float products.
  EXPECT_LE(max_err, 2e-6);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  // L = sum(rope(x) * r): dL/dx from rope_backward(r) against central differences of the double
  // reference. Tolerance: max |analytic - numeric| / max |numeric| <= 1e-5 (float analytic vs
  // double numeric; the map is linear, so the differences are exact up to rounding).
  const int64_t B = 1, T = 5, H = 2, hd = 8;
  const double theta = 10000.0;
  const RopeTable table = RopeTable::build(T, hd, theta);
  const std::vector<float> x = random_vec(B * T * H * hd, 2);
  const std::vector<float> r = random_vec(x.size(), 3);
  std::vector<float> grad = r;
  kernels::rope_backward(view(grad.data(), {B, T, H, hd}), table.cos_view(), table.sin_view(), 0);

  std::vector<double> xd = to_double(x);
  auto loss = [&](const std::vector<double>& in) {
    const std::vector<double> out = reference_rope(in, B, T, H, hd, theta);
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * static_cast<double>(r[i]);
    return l;
  };
  const double eps = 1e-6;
  double max_diff = 0.0, max_num = 0.0;
  for (size_t i = 0; i < xd.size(); ++i) {
    const double saved = xd[i];
    xd[i] = saved + eps;
    const double lp = loss(xd);
    xd[i] = saved - eps;
    const double lm = loss(xd);
    xd[i] = saved;
    const double num = (lp - lm) / (2 * eps);
    max_diff = std::max(max_diff, std::abs(static_cast<double>(grad[i]) - num));
    max_num = std::max(max_num, std::abs(num));
  }
  EXPECT_LE(max_diff / max_num, 1e-5);
}

TEST(Rope, BackwardInvertsForward) {
  // The rotation is orthogonal: backward(forward(x)) == x up to float rounding.
  const int64_t B = 2, T = 40, H = 2, hd = 64;
  const RopeTable table = RopeTable::build(T, hd, 1e6);
  const std::vector<float> x0 = random_vec(B * T * H * hd, 4);
  std::vector<float> x = x0;
  kernels::rope_forward(view(x.data(), {B, T, H, hd}), table.cos_view(), table.sin_view(), 0);
  kernels::rope_backward(view(x.data(), {B, T, H, hd}), table.cos_view(), table.sin_view(), 0);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x0[i], 1e-6) << i;
}

TEST(Rope, PositionZeroIsIdentityAndNormsArePreserved) {
  const int64_t B = 2, T = 50, H = 3, hd = 32;
  const RopeTable table = RopeTable::build(64, hd, 10000.0);
  const std::vector<float> x0 = random_vec(B * T * H * hd, 5);
  std::vector<float> x = x0;
  kernels::rope_forward(view(x.data(), {B, T, H, hd}), table.cos_view(), table.sin_view(), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * hd;
        double n0 = 0.0, n1 = 0.0;
        for (int64_t i = 0; i < hd; ++i) {
          // cos(0) = 1 and sin(0) = 0 exactly, so position 0 is bit-for-bit unchanged.
          if (t == 0) {
            ASSERT_EQ(x[base + i], x0[base + i]);
          }
          const double a0 = x0[base + i], a1 = x[base + i];
          n0 += a0 * a0;
          n1 += a1 * a1;
        }
        // Rotation preserves the norm up to float rounding of cos/sin and the products.
        ASSERT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-6 * std::sqrt(n0) + 1e-7);
      }
  // And positions > 0 really do rotate (guards against a no-op implementation).
  double moved = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    moved = std::max(moved, std::abs(static_cast<double>(x[i]) - static_cast<double>(x0[i])));
  EXPECT_GT(moved, 0.1);
}

TEST(Rope, RejectsBadArguments) {
  EXPECT_THROW(RopeTable::build(8, 7, 10000.0), Error);
  EXPECT_THROW(RopeTable::build(8, 0, 10000.0), Error);
  EXPECT_THROW(RopeTable::build(0, 8, 10000.0), Error);
  const RopeTable table = RopeTable::build(8, 8, 10000.0);
  std::vector<float> x(2 * 16 * 8);
  EXPECT_THROW(
      kernels::rope_forward(view(x.data(), {1, 9, 1, 8}), table.cos_view(), table.sin_view(), 0),
      Error);  // seq > max_positions
  EXPECT_THROW(
      kernels::rope_forward(view(x.data(), {1, 4, 1, 4}), table.cos_view(), table.sin_view(), 0),
      Error);  // head_dim mismatch
  EXPECT_THROW(
      kernels::rope_backward(view(x.data(), {1, 9, 1, 8}), table.cos_view(), table.sin_view(), 0),
      Error);  // seq > max_positions
}

}  // namespace
}  // namespace moecore
