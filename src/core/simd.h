// Vectorisable elementwise code for the hot loops that are not GEMMs.
//
// The build targets the x86-64 baseline (SSE2) so that one binary runs on any x86-64 CPU. Loops
// marked MOECORE_SIMD_CLONES are compiled three times, for AVX-512 (x86-64-v4), AVX2 (x86-64-v3)
// and the baseline, and the dynamic loader picks the best clone for the CPU it runs on (GCC
// function multiversioning). Floating-point contraction is off (-ffp-contract=off, CMakeLists.txt's
// MOECORE_ENGINE_FP_FLAGS, ctest Numerics.FpContractOff: GCC would otherwise fuse a*b+c in the two
// FMA clones only), the fused multiply-adds that pay are written out as std::fma (the instruction
// in the FMA clones, libm's exactly rounded fma in the baseline one), and no loop here reassociates
// a sum, so every clone gives bit-identical results. OpenMP outlines the body of a parallel loop
// into a function of its own, which does not inherit the clones: the cloned functions are the
// per-row / per-chunk bodies, called from the parallel loops.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#define MOECORE_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MOECORE_SIMD_CLONES
#endif

namespace moecore {

// Partial sums are kept in this many lanes (one AVX-512 register of floats) and added in lane
// order at the end: a fixed summation order the compiler can vectorise without -ffast-math.
inline constexpr int64_t kSumLanes = 16;

inline float sum_lanes(const float (&lanes)[kSumLanes]) {
  float total = 0.0f;
  for (const float lane : lanes) total += lane;
  return total;
}

// sum_{j < n} term(j), accumulated in kSumLanes lanes (element j in lane j % kSumLanes) and the
// lanes added in order. Inlined into the cloned callers, where it vectorises: the terms of a block
// are first written to a buffer by a plain loop over j, then added to the lanes. (Summed straight
// into the lanes, a term with selects in it, such as exp_vectorizable, was not vectorised at all:
// the lanes' loop is unrolled before the vectoriser runs, and the straight-line vectoriser cannot
// take the selects' branches: cross-entropy's sum of exps ran one element at a time.) Always
// inlined: a copy of its own would be compiled for the baseline, not for the caller's clone.
template <typename Term>
[[gnu::always_inline]] inline float lane_sum(int64_t n, Term term) {
  // A float term: a wider one would be rounded to float in the buffer before it is added.
  static_assert(std::is_same_v<std::invoke_result_t<Term&, int64_t>, float>,
                "lane_sum adds float terms");
  constexpr int64_t kBlock = 16 * kSumLanes;  // a multiple of the lanes: j0 % kSumLanes == 0
  float lanes[kSumLanes] = {};
  float terms[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t count = std::min(kBlock, n - j0);
    for (int64_t i = 0; i < count; ++i) terms[i] = term(j0 + i);
    const int64_t full = count - count % kSumLanes;
    for (int64_t i = 0; i < full; i += kSumLanes)
      for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] += terms[i + l];
    for (int64_t i = full; i < count; ++i) lanes[i - full] += terms[i];
  }
  return sum_lanes(lanes);
}

// max_{j < n} x[j] (-inf for n = 0), reduced in kSumLanes lanes.
inline float lane_max(const float* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  float lanes[kSumLanes];
  std::fill(lanes, lanes + kSumLanes, lowest);
  const int64_t full = n - n % kSumLanes;
  for (int64_t j = 0; j < full; j += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] = std::max(lanes[l], x[j + l]);
  for (int64_t j = full; j < n; ++j) lanes[j - full] = std::max(lanes[j - full], x[j]);
  float result = lowest;
  for (const float lane : lanes) result = std::max(result, lane);
  return result;
}

// e^x in float, written so that loops over it vectorise (std::exp is a libm call that GCC
// vectorises only under -ffast-math). Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2 and
// Cephes' degree-6 minimax polynomial for e^r, both in fused multiply-adds (with separate ones a
// default step took 4-6 % longer on an AVX2 EPYC); within 2 ulp of the correctly rounded result
// over the whole float range (tests/cpp/test_simd.cpp sweeps it). Results below the smallest normal
// float (x < -87.336) are 0 rather than subnormal, +inf above the largest float, NaN stays NaN.
inline float exp_vectorizable(float x) {
  constexpr float kMinArg = -87.33654f;  // ln(FLT_MIN)
  constexpr float kMaxArg = 88.72283f;   // ln(FLT_MAX)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // kMinArg first: std::max(a, b) is (a < b) ? b : a, so a NaN x clamps to kMinArg (its result is
  // replaced below) rather than reaching the conversion to int, where a NaN is undefined behaviour.
  const float clamped = std::min(std::max(kMinArg, x), kMaxArg);
  const float kf = (clamped * kLog2e + kRoundShift) - kRoundShift;
  const float r = std::fma(-kf, kLn2Lo, std::fma(-kf, kLn2Hi, clamped));
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float er = std::fma(p, r * r, r) + 1.0f;
  // 2^k as two normal powers of two (k is in [-126, 128]; 2^128 itself is not a float).
  const int32_t k = static_cast<int32_t>(kf);
  const int32_t k_half = k >> 1;
  const float scale_a = std::bit_cast<float>((k_half + 127) << 23);
  const float scale_b = std::bit_cast<float>((k - k_half + 127) << 23);
  float result = er * scale_a * scale_b;
  result = x < kMinArg ? 0.0f : result;
  result = x > kMaxArg ? std::numeric_limits<float>::infinity() : result;
  return x != x ? x : result;
}

}  // namespace moecore
