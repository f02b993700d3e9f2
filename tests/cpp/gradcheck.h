// Finite-difference gradient checking in the style of ggml's test-backend-ops: a scalar loss of
// the forward (usually a random projection L = sum(out * r), summed in double), central
// differences with the float step actually taken, and a normalized error
//   max_i |analytic_i - numeric_i| / max_i |numeric_i|.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace moecore::gradcheck {

// Tolerance of every finite-difference check in these tests, relative to the largest |numeric
// gradient| of the tensor checked. Derived: the fp32 forward's rounding (a few u |L|, u = 2^-24,
// summed in another order by each CPU's GEMM kernels) divided by the step eps ~1e-2..1e-3 gives
// noise ~1e-7 |L| / eps, plus O(eps^2) truncation; a wrong gradient (a missing term, a transposed
// index) is off by >= 1e-2, usually O(1). Measured worst (tests/TOLERANCES.md): 3.7e-4 for the
// layer / router / MoE checks (MoeGradients.ExpertWithZeroTokens with DNNL_MAX_CPU_ISA=AVX2; 3.3e-4
// with the AVX-512 kernels), 3.8e-3 for the whole-model sample of test_transformer_gradients.
inline constexpr double kTolerance = 1e-2;

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// L = sum(out * r) in double.
inline double project(const float* out, const std::vector<float>& r) {
  double total = 0.0;
  for (size_t i = 0; i < r.size(); ++i)
    total += static_cast<double>(out[i]) * static_cast<double>(r[i]);
  return total;
}

// (f(x + eps) - f(x - eps)) / (step actually taken in float) for element i of x; x is restored.
template <typename F>
double central_difference(float* x, size_t i, float eps, F&& f) {
  const float original = x[i];
  x[i] = original + eps;
  const double plus_x = static_cast<double>(x[i]);
  const double f_plus = f();
  x[i] = original - eps;
  const double minus_x = static_cast<double>(x[i]);
  const double f_minus = f();
  x[i] = original;
  return (f_plus - f_minus) / (plus_x - minus_x);
}

struct GradCheck {
  double max_err = 0.0;  // max |analytic - numeric|
  double max_ref = 0.0;  // max |numeric|
  size_t checked = 0;
  double normalized() const { return max_err / std::max(max_ref, 1e-30); }
};

// Checks analytic[i] against central differences of f at x[i] for each i in `indices`.
template <typename F>
GradCheck check_indices(float* x, const float* analytic, const std::vector<size_t>& indices,
                        float eps, F&& f) {
  GradCheck r;
  for (size_t i : indices) {
    const double numeric = central_difference(x, i, eps, f);
    r.max_err = std::max(r.max_err, std::abs(static_cast<double>(analytic[i]) - numeric));
    r.max_ref = std::max(r.max_ref, std::abs(numeric));
    ++r.checked;
  }
  return r;
}

// How many elements check_all checks at most: all of them, unless a test program whose forward
// is expensive (the CUDA backend on the emulated GPU, tests/cuda_sim) lowers it; then that many
// evenly spread over the tensor, its first and last included. The analytic gradient is compared
// with the reference backend's in full by the same tests either way.
// Under AddressSanitizer (the asan-ubsan preset): 64. That build looks for memory errors, which
// the first forward and backward of a case meet on the same paths as every later one; the release
// build's run of the same tests checks every element. Each element costs two forwards, and the
// sanitized attention cases alone took a minute of `make test` checking all of them.
inline size_t& max_checked_elements() {
#if defined(__SANITIZE_ADDRESS__)
  static size_t limit = 64;
#else
  static size_t limit = SIZE_MAX;
#endif
  return limit;
}

template <typename F>
GradCheck check_all(float* x, size_t n, const float* analytic, float eps, F&& f) {
  const size_t checked = std::min(n, std::max(max_checked_elements(), size_t{2}));
  std::vector<size_t> indices(checked);
  if (checked == n) {
    std::iota(indices.begin(), indices.end(), size_t{0});
  } else {
    for (size_t k = 0; k < checked; ++k) indices[k] = k * (n - 1) / (checked - 1);
  }
  return check_indices(x, analytic, indices, eps, f);
}

// Gradient added by a backward into a buffer that held `before` (the += rule).
inline std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> out(after.size());
  for (size_t i = 0; i < after.size(); ++i) out[i] = after[i] - before[i];
  return out;
}

inline void expect_close(const GradCheck& r, const std::string& what,
                         double tolerance = kTolerance) {
  EXPECT_GT(r.checked, 0u) << what;
  EXPECT_GT(r.max_ref, 0.0) << what << ": numeric gradient is identically zero";
  EXPECT_LT(r.normalized(), tolerance)
      << what << ": max|analytic - numeric| = " << r.max_err << ", max|numeric| = " << r.max_ref;
}

}  // namespace moecore::gradcheck
