// bf16 GEMMs (both paths) against an fp64 reference, every transpose combination, beta 0 and 1,
// alpha != 1, odd shapes, padded leading dimensions and k = 0; plus the precision switch that
// routes kernels::gemm. Tolerances are per element, relative to S = sum_k |a_ik||b_kj| (+ |beta
// c|), the size of the terms summed:
//  - vs fp64 over the bf16-rounded operands: only fp32 accumulation error, bounded by
//    (k + 2) * 2^-24 * S (the classic gamma_k bound plus the final scale and beta terms);
//  - vs fp64 over the unrounded fp32 operands: each product is also off by the two operand
//    roundings, each at most 2^-8 relative (round to nearest with 8 significant bits), so
//    (2 * 2^-8 + 2^-16) * S more.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/gemm.h"

namespace moecore::kernels {
namespace {

constexpr double kUnitFp32 = 1.0 / (1 << 24);  // fp32 unit roundoff
constexpr double kBf16OperandError = 2.0 / (1 << 8) + 1.0 / (1 << 16);

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
};

std::string name(const Case& c) {
  return "ta=" + std::to_string(c.trans_a) + " tb=" + std::to_string(c.trans_b) +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta);
}

// Runs one case on `path` and checks it against both references.
void check_case(Bf16GemmPath path, const Case& c, uint32_t seed, int64_t padding = 3) {
  // Stored shapes with `padding` columns (3 unless asked), so lda/ldb/ldc differ from the logical
  // widths; with none, C is dense (as the fixed-shape AMX kernels need).
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + padding, ldb = b_cols + padding, ldc = c.n + padding;
  const std::vector<float> a = random_vec(static_cast<size_t>(a_rows * lda), seed);
  const std::vector<float> b = random_vec(static_cast<size_t>(b_rows * ldb), seed + 1);
  const std::vector<float> c0 = random_vec(static_cast<size_t>(c.m * ldc), seed + 2);
  std::vector<float> out = c0;
  gemm_bf16(path, c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb,
            c.beta, out.data(), ldc);
  auto at_a = [&](int64_t i, int64_t p) { return a[c.trans_a ? p * lda + i : i * lda + p]; };
  auto at_b = [&](int64_t p, int64_t j) { return b[c.trans_b ? j * ldb + p : p * ldb + j]; };
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double rounded = 0.0, exact = 0.0, size = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = at_a(i, p), y = at_b(p, j);
        rounded += static_cast<double>(round_to_bf16(at_a(i, p))) *
                   static_cast<double>(round_to_bf16(at_b(p, j)));
        exact += x * y;
        size += std::abs(x * y);
      }
      const double alpha = c.alpha, beta = c.beta;
      const double prior = static_cast<double>(c0[static_cast<size_t>(i * ldc + j)]);
      const double got = static_cast<double>(out[static_cast<size_t>(i * ldc + j)]);
      const double scale = std::abs(alpha) * size + std::abs(beta * prior);
      const double tight = static_cast<double>(c.k + 2) * kUnitFp32 * scale + 1e-30;
      ASSERT_LE(std::abs(got - (alpha * rounded + beta * prior)), tight)
          << name(c) << " at (" << i << ", " << j << ") vs fp64 of bf16-rounded operands";
      ASSERT_LE(std::abs(got - (alpha * exact + beta * prior)),
                tight + std::abs(alpha) * kBf16OperandError * size)
          << name(c) << " at (" << i << ", " << j << ") vs fp64 of fp32 operands";
    }
  }
  // Padding columns of C are never written.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldc; ++j)
      ASSERT_EQ(out[static_cast<size_t>(i * ldc + j)], c0[static_cast<size_t>(i * ldc + j)]);
}

std::vector<Bf16GemmPath> paths() {
  // The emulated path runs everywhere; the native one where this CPU and oneDNN allow it.
  std::vector<Bf16GemmPath> p{Bf16GemmPath::kEmulated};
  if (bf16_gemm_path() == Bf16GemmPath::kNative) p.push_back(Bf16GemmPath::kNative);
  return p;
}

TEST(Bf16Gemm, MatchesFp64ReferenceEveryTransposeAndBeta) {
  const int64_t shapes[][3] = {{1, 1, 1},    {3, 5, 7},    {17, 33, 9}, {64, 130, 257},
                               {1, 100, 50}, {100, 1, 50}, {31, 47, 1}};
  uint32_t seed = 1;
  for (const Bf16GemmPath path : paths())
    for (const auto& s : shapes)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true})
          for (const float beta : {0.0f, 1.0f})
            for (const float alpha : {1.0f, 0.375f}) {
              SCOPED_TRACE(path == Bf16GemmPath::kNative ? "native" : "emulated");
              check_case(path, {ta, tb, s[0], s[1], s[2], alpha, beta}, seed += 3);
            }
}

// Dense operands, as the native path on AMX runs through fixed-shape primitives (their first rows,
// rounded down: 128 of 130, 1024 of 1100) and the runtime one (the rest); checked against the
// same references, with beta 0 over NaN in C (beta 0 must not read C).
TEST(Bf16Gemm, DenseOperandsMatchFp64Reference) {
  const int64_t shapes[][3] = {{64, 64, 64}, {130, 64, 256}, {1100, 128, 64}, {200, 128, 200}};
  uint32_t seed = 101;
  for (const Bf16GemmPath path : paths())
    for (const auto& s : shapes)
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 1.0f})
          for (const float alpha : {1.0f, 0.375f}) {
            SCOPED_TRACE(path == Bf16GemmPath::kNative ? "native" : "emulated");
            check_case(path, {false, tb, s[0], s[1], s[2], alpha, beta}, seed += 3, 0);
          }
  for (const Bf16GemmPath path : paths()) {
    const int64_t m = 130, n = 64, k = 128;
    const std::vector<float> a = random_vec(static_cast<size_t>(m * k), 7);
    const std::vector<float> b = random_vec(static_cast<size_t>(k * n), 8);
    std::vector<float> c(static_cast<size_t>(m * n), std::nanf(""));
    gemm_bf16(path, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    for (const float v : c) ASSERT_TRUE(std::isfinite(v));
  }
}

// Which calls take the fixed-shape AMX kernels: where oneDNN has AMX (its effective ISA, which
// DNNL_MAX_CPU_ISA may lower), a row-major A's dense calls with small K and B; never the weight
// gradients' transposed A, a C with padding (ldc > N), N not a multiple of 64, K over 1024, B over
// 2^20 values, or fewer than 64 rows. Without AMX no call does.
TEST(Bf16Gemm, FixedShapeKernelsRunWhereTheyPay) {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned amx_bits = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  const bool amx = bf16_gemm_path() == Bf16GemmPath::kNative && (isa & amx_bits) == amx_bits;
  // An expert's gate/up forward and input gradient, the LM head's forward, a flash-attention block.
  EXPECT_EQ(bf16_gemm_runs_fixed_shape(false, true, 1100, 512, 256, 1.0f, 0.0f, 512), amx);
  EXPECT_EQ(bf16_gemm_runs_fixed_shape(false, false, 700, 256, 512, 1.0f, 0.0f, 256), amx);
  EXPECT_EQ(bf16_gemm_runs_fixed_shape(false, true, 2048, 4096, 256, 1.0f, 0.0f, 4096), amx);
  EXPECT_EQ(bf16_gemm_runs_fixed_shape(false, true, 64, 128, 64, 0.125f, 0.0f, 128), amx);
  EXPECT_EQ(bf16_gemm_runs_fixed_shape(false, false, 64, 64, 128, 1.0f, 1.0f, 64), amx);
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(true, false, 512, 256, 1024, 1.0f, 1.0f, 256));
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(false, false, 64, 64, 128, 1.0f, 0.0f, 256));
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(false, true, 512, 100, 256, 1.0f, 0.0f, 100));
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(false, false, 2048, 256, 4096, 1.0f, 0.0f, 256));
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(false, true, 2048, 4096, 1024, 1.0f, 0.0f, 4096));
  EXPECT_FALSE(bf16_gemm_runs_fixed_shape(false, true, 63, 512, 256, 1.0f, 0.0f, 512));
}

TEST(Bf16Gemm, KZeroScalesC) {
  for (const Bf16GemmPath path : paths())
    for (const float beta : {0.0f, 1.0f, 0.5f}) {
      std::vector<float> c(6, 3.0f);
      if (beta == 0.0f) c[0] = std::nanf("");  // beta 0 must not read C
      gemm_bf16(path, false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, beta, c.data(), 3);
      for (const float v : c) EXPECT_EQ(v, beta * 3.0f);
    }
}

TEST(Bf16Gemm, BetaZeroIgnoresNanInC) {
  const std::vector<float> a = random_vec(8 * 16, 7), b = random_vec(16 * 8, 8);
  for (const Bf16GemmPath path : paths()) {
    std::vector<float> c(64, std::nanf(""));
    gemm_bf16(path, false, false, 8, 8, 16, 1.0f, a.data(), 16, b.data(), 8, 0.0f, c.data(), 8);
    for (const float v : c) EXPECT_TRUE(std::isfinite(v));
  }
}

// Both paths sum the same exact products; they may differ only by fp32 summation order.
TEST(Bf16Gemm, NativeAndEmulatedAgree) {
  if (bf16_gemm_path() != Bf16GemmPath::kNative) GTEST_SKIP() << "no native bf16 on this CPU";
  const int64_t m = 70, n = 90, k = 300;
  const std::vector<float> a = random_vec(static_cast<size_t>(m * k), 11);
  const std::vector<float> b = random_vec(static_cast<size_t>(k * n), 12);
  std::vector<float> native(static_cast<size_t>(m * n)), emulated(native.size());
  gemm_bf16(Bf16GemmPath::kNative, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
            native.data(), n);
  gemm_bf16(Bf16GemmPath::kEmulated, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
            emulated.data(), n);
  // |a|, |b| <= 2, so S <= 4 k; both are within (k + 2) u S of the same sum.
  const double bound = 2.0 * static_cast<double>(k + 2) * kUnitFp32 * 4.0 * static_cast<double>(k);
  for (size_t i = 0; i < native.size(); ++i)
    ASSERT_LE(std::abs(static_cast<double>(native[i]) - static_cast<double>(emulated[i])), bound);
}

// Operands given as bf16 bits (gemm_bf16_b16: B, a weight copy; gemm_bf16_a16: A, an activation
// rounded once for several GEMMs; gemm_bf16_ab16: both) give exactly what the fp32 operands give,
// on both paths (the emulated one on every CPU, the native one where it runs), every transpose,
// beta 0 and 1: all round the operands the same way and run the same GEMM.
TEST(Bf16Gemm, Bf16OperandsGiveTheProductsOfTheirFp32Values) {
  const int64_t m = 13, n = 37, k = 70;
  const std::vector<float> a = random_vec(static_cast<size_t>(m * k), 21);
  const std::vector<float> b = random_vec(static_cast<size_t>(k * n), 22);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16(b[i]);
  std::vector<Bf16GemmPath> paths = {Bf16GemmPath::kEmulated};
  if (bf16_gemm_path() == Bf16GemmPath::kNative) paths.push_back(Bf16GemmPath::kNative);
  for (const Bf16GemmPath path : paths)
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true})
        for (const float beta : {0.0f, 1.0f}) {
          std::vector<float> from_fp32 = random_vec(static_cast<size_t>(m * n), 23);
          std::vector<float> from_b_bits = from_fp32, from_a_bits = from_fp32,
                             from_both_bits = from_fp32;
          const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
          gemm_bf16(path, trans_a, trans_b, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta,
                    from_fp32.data(), n);
          gemm_bf16_b16(path, trans_a, trans_b, m, n, k, 0.5f, a.data(), lda, b16.data(), beta,
                        from_b_bits.data(), n);
          gemm_bf16_a16(path, trans_a, trans_b, m, n, k, 0.5f, a16.data(), b.data(), ldb, beta,
                        from_a_bits.data(), n);
          gemm_bf16_ab16(path, trans_a, trans_b, m, n, k, 0.5f, a16.data(), b16.data(), beta,
                         from_both_bits.data(), n);
          const std::string where = std::string("path ") +
                                    (path == Bf16GemmPath::kNative ? "native" : "emulated") +
                                    " ta " + std::to_string(trans_a) + " tb " +
                                    std::to_string(trans_b) + " beta " + std::to_string(beta);
          ASSERT_EQ(from_b_bits, from_fp32) << where;
          ASSERT_EQ(from_a_bits, from_fp32) << where;
          ASSERT_EQ(from_both_bits, from_fp32) << where;
        }
}

// The native path is chosen exactly when the CPU has AVX512-BF16 and oneDNN may use it;
// the ctest entry Bf16Gemm.DispatchWithoutBf16Isa runs this with DNNL_MAX_CPU_ISA=AVX512_CORE,
// Numerics.Avx2Kernels with AVX2. oneDNN reads ONEDNN_MAX_CPU_ISA first, then DNNL_MAX_CPU_ISA.
TEST(Bf16Gemm, DispatchHonoursCpuAndMaxCpuIsa) {
  const char* max_isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (max_isa == nullptr) max_isa = std::getenv("DNNL_MAX_CPU_ISA");
  __builtin_cpu_init();
  // The caps below avx512_core_bf16 (oneDNN's names; a cap at or above it leaves bf16 on).
  const std::string cap = max_isa != nullptr ? max_isa : "";
  const bool capped = cap == "SSE41" || cap == "AVX" || cap == "AVX2" || cap == "AVX2_VNNI" ||
                      cap == "AVX2_VNNI_2" || cap == "AVX512_CORE" || cap == "AVX512_CORE_VNNI";
  const bool native = __builtin_cpu_supports("avx512bf16") != 0 && !capped;
  EXPECT_EQ(bf16_gemm_path(), native ? Bf16GemmPath::kNative : Bf16GemmPath::kEmulated);
}

TEST(MatmulPrecision, GemmMultipliesInTheGivenPrecision) {
  const int64_t m = 9, n = 11, k = 13;
  const std::vector<float> a = random_vec(static_cast<size_t>(m * k), 21);
  const std::vector<float> b = random_vec(static_cast<size_t>(k * n), 22);
  std::vector<float> fp32(static_cast<size_t>(m * n)), bf16(fp32.size()), got(fp32.size());
  gemm_fp32(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, fp32.data(), n);
  gemm_bf16(bf16_gemm_path(), false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
            bf16.data(), n);
  ASSERT_NE(fp32, bf16);
  gemm(MatmulPrecision::kFp32, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
       got.data(), n);
  EXPECT_EQ(got, fp32);
  gemm(MatmulPrecision::kBf16, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
       got.data(), n);
  EXPECT_EQ(got, bf16);
}

TEST(Bf16, RoundingIsNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 and 1 + 2^-6: ties to 1 + 2^-6.
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 1.0f / 64);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256 + 1.0f / 4096), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::nanf(""))));
  EXPECT_EQ(round_to_bf16(INFINITY), INFINITY);
  // Past the largest bf16 (3.3895e38) by more than half its spacing (2^120): overflows to -Inf.
  EXPECT_EQ(round_to_bf16(-3.4e38f), -INFINITY);
}

}  // namespace
}  // namespace moecore::kernels
