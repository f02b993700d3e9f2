// The MX GEMM on the CPU (kernels/cpu/mx_gemm.h) against the scalar MX dot-product reference
// (kernels/reference/mx_gemm.h): bit-identical on odd M and N, several K, both element types and
// scale modes, extreme block exponents (the kernel's rare scaling path), NaN / Inf blocks, a padded
// output stride and any thread count, for every inner kernel the CPU can run. The reference itself
// is checked against an fp64 evaluation of the same dequantised product, within the derived worst
// case of its fp32 summation: |C - C_exact| <= gamma_n * sum_k |a_k b_k| with
// gamma_n = n u / (1 - n u), u = 2^-24 and n = K + K / 32 the number of additions any one term
// goes through (tests/TOLERANCES.md, kind 2).
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/mx_types.h"
#include "kernels/cpu/mx_gemm.h"
#include "kernels/reference/mx_gemm.h"

namespace moecore::kernels {
namespace {

using mx::ElemType;
using mx::ScaleMode;

struct Quantized {
  std::vector<uint8_t> codes, scales;
  mx::MxOperand operand(ElemType elem) const { return {elem, codes.data(), scales.data()}; }
};

// rows x k values whose magnitudes vary by 2^spread from row to row and within a row.
std::vector<float> random_matrix(int64_t rows, int64_t k, int spread, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> shift(-spread, spread);
  std::vector<float> x(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    const int row_shift = shift(gen);
    for (int64_t c = 0; c < k; ++c)
      x[r * k + c] = std::ldexp(normal(gen), row_shift + shift(gen) / 4);
  }
  return x;
}

Quantized quantize(ElemType elem, ScaleMode mode, int64_t rows, int64_t k,
                   const std::vector<float>& x) {
  Quantized q{std::vector<uint8_t>(rows * k), std::vector<uint8_t>(rows * k / mx::kMxBlock)};
  mx::quantize(elem, mode, rows, k, x.data(), k, q.codes.data(), q.scales.data());
  return q;
}

// Same bits, or both NaN (NaN payloads are not part of the contract).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " index " << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << what << " index " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

struct Shape {
  int64_t m, n, k;
};

// Every inner kernel this CPU can run (cpu::MxGemmKernel), each held to the reference's bits, not
// only the one the CPU picks: an AVX-512 machine checks the AVX2 kernel too, and an AVX2 one the
// generic kernel's AVX2 clone.
std::vector<cpu::MxGemmKernel> kernels_here() {
  std::vector<cpu::MxGemmKernel> kernels{cpu::MxGemmKernel::kGeneric};
  if (cpu::mx_gemm_kernel_available(cpu::MxGemmKernel::kAvx2))
    kernels.push_back(cpu::MxGemmKernel::kAvx2);
  return kernels;
}

std::string kernel_name(cpu::MxGemmKernel kernel) {
  return kernel == cpu::MxGemmKernel::kAvx2 ? "avx2 kernel" : "generic kernel";
}

TEST(MxGemm, CpuKernelIsBitIdenticalToTheReference) {
  // 515 rows: A is decoded 256 rows at a time, so three chunks, the last a partial row group.
  const Shape shapes[] = {{1, 1, 32},  {3, 5, 64},    {17, 67, 96}, {33, 129, 320},
                          {65, 1, 32}, {2, 200, 160}, {515, 70, 64}};
  const ElemType elems[][2] = {{ElemType::kE4M3, ElemType::kE4M3},
                               {ElemType::kE5M2, ElemType::kE5M2},
                               {ElemType::kE4M3, ElemType::kE5M2}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (const auto& elem : elems) {
      for (const ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
        const Quantized a = quantize(elem[0], mode, s.m, s.k, random_matrix(s.m, s.k, 8, ++seed));
        const Quantized b = quantize(elem[1], mode, s.n, s.k, random_matrix(s.n, s.k, 8, ++seed));
        std::vector<float> ref(s.m * s.n);
        reference::mx_gemm(s.m, s.n, s.k, a.operand(elem[0]), b.operand(elem[1]), ref.data(), s.n);
        const std::string what =
            "m" + std::to_string(s.m) + " n" + std::to_string(s.n) + " k" + std::to_string(s.k) +
            " " + std::string(mx::elem_type_name(elem[0])) + "x" +
            std::string(mx::elem_type_name(elem[1])) + " " + std::string(mx::scale_mode_name(mode));
        for (const cpu::MxGemmKernel kernel : kernels_here()) {
          std::vector<float> fast(s.m * s.n);
          cpu::mx_gemm(s.m, s.n, s.k, a.operand(elem[0]), b.operand(elem[1]), fast.data(), s.n,
                       kernel);
          expect_same_bits(fast, ref, what + ", " + kernel_name(kernel));
        }

        // The reference against fp64 over the same dequantised operands.
        std::vector<float> a_values(s.m * s.k), b_values(s.n * s.k);
        mx::dequantize(elem[0], s.m, s.k, a.codes.data(), a.scales.data(), a_values.data());
        mx::dequantize(elem[1], s.n, s.k, b.codes.data(), b.scales.data(), b_values.data());
        const double additions = static_cast<double>(s.k + s.k / mx::kMxBlock);
        const double gamma = additions * 0x1p-24 / (1.0 - additions * 0x1p-24);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            double exact = 0.0, magnitude = 0.0;
            for (int64_t kk = 0; kk < s.k; ++kk) {
              const double term = static_cast<double>(a_values[i * s.k + kk]) *
                                  static_cast<double>(b_values[j * s.k + kk]);
              exact += term;
              magnitude += std::fabs(term);
            }
            ASSERT_LE(std::fabs(static_cast<double>(ref[i * s.n + j]) - exact), gamma * magnitude)
                << what << " (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(MxGemm, ExtremeExponentsNanAndInf) {
  const int64_t m = 7, n = 70, k = 96;
  std::vector<float> a_values = random_matrix(m, k, 4, 101);
  std::vector<float> b_values = random_matrix(n, k, 4, 102);
  // Blocks whose combined scale leaves fp32's normal range both ways: 2^100 * 2^60 overflows,
  // 2^-100 * 2^-60 lands among the subnormals (rounded once).
  for (int64_t c = 0; c < 32; ++c) {
    a_values[0 * k + c] *= 0x1p100f;
    b_values[3 * k + c] *= 0x1p60f;
    a_values[1 * k + 32 + c] *= 0x1p-100f;
    b_values[5 * k + 32 + c] *= 0x1p-60f;
  }
  a_values[2 * k + 70] = std::numeric_limits<float>::quiet_NaN();
  b_values[9 * k + 5] = std::numeric_limits<float>::infinity();
  b_values[66 * k + 40] = -std::numeric_limits<float>::infinity();
  // Row 4's second block is all zeros: below, B row 20's second block gets the NaN scale with
  // finite elements (as an operand produced elsewhere may have it), so the block sum is 0 and the
  // contribution must still be NaN.
  for (int64_t c = 32; c < 64; ++c) a_values[4 * k + c] = 0.0f;
  for (const ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    const Quantized a = quantize(ElemType::kE4M3, mode, m, k, a_values);
    Quantized b = quantize(ElemType::kE4M3, mode, n, k, b_values);
    b.scales[20 * (k / mx::kMxBlock) + 1] = mx::kE8m0Nan;
    const int64_t ldc = n + 3;  // padded rows: the gap must stay untouched
    std::vector<float> ref(m * ldc, 7.0f);
    reference::mx_gemm(m, n, k, a.operand(ElemType::kE4M3), b.operand(ElemType::kE4M3), ref.data(),
                       ldc);
    for (const cpu::MxGemmKernel kernel : kernels_here()) {
      std::vector<float> fast(m * ldc, 7.0f);
      cpu::mx_gemm(m, n, k, a.operand(ElemType::kE4M3), b.operand(ElemType::kE4M3), fast.data(),
                   ldc, kernel);
      expect_same_bits(fast, ref,
                       std::string(mx::scale_mode_name(mode)) + ", " + kernel_name(kernel));
      for (int64_t i = 0; i < m; ++i) EXPECT_EQ(fast[i * ldc + n], 7.0f) << kernel_name(kernel);
    }
    EXPECT_TRUE(std::isinf(ref[0 * ldc + 3]));  // 2^160 times O(1)
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(ref[2 * ldc + j])) << j;  // NaN row
    for (int64_t i = 0; i < m; ++i) EXPECT_TRUE(std::isnan(ref[i * ldc + 20])) << i;
    for (int64_t i = 0; i < m; ++i) {
      if (i != 2) {
        EXPECT_FALSE(std::isnan(ref[i * ldc + 9])) << i;  // an Inf element saturated
      }
    }
  }
}

TEST(MxGemm, SameBitsAtEveryThreadCount) {
  const int64_t m = 37, n = 131, k = 128;
  const Quantized a = quantize(ElemType::kE4M3, ScaleMode::kRceil, m, k, random_matrix(m, k, 6, 5));
  const Quantized b = quantize(ElemType::kE4M3, ScaleMode::kRceil, n, k, random_matrix(n, k, 6, 6));
  std::vector<float> ref(m * n);
  reference::mx_gemm(m, n, k, a.operand(ElemType::kE4M3), b.operand(ElemType::kE4M3), ref.data(),
                     n);
  const int saved = omp_get_max_threads();
  for (const int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    for (const cpu::MxGemmKernel kernel : kernels_here()) {
      std::vector<float> fast(m * n);
      cpu::mx_gemm(m, n, k, a.operand(ElemType::kE4M3), b.operand(ElemType::kE4M3), fast.data(), n,
                   kernel);
      expect_same_bits(fast, ref, std::to_string(threads) + " threads, " + kernel_name(kernel));
    }
  }
  omp_set_num_threads(saved);
}

TEST(MxGemm, ContractionNotAMultipleOf32IsAnError) {
  const std::vector<uint8_t> codes(4 * 100), scales(16);
  const mx::MxOperand op{ElemType::kE4M3, codes.data(), scales.data()};
  std::vector<float> c(16);
  for (const bool fast : {true, false}) {
    try {
      if (fast) {
        cpu::mx_gemm(4, 4, 100, op, op, c.data(), 4);
      } else {
        reference::mx_gemm(4, 4, 100, op, op, c.data(), 4);
      }
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("[mx_gemm] contraction dimension k=100 is not a positive multiple of "
                             "the MX block size 32"),
                std::string::npos)
          << message;
      EXPECT_EQ(message.find('\n'), std::string::npos);
    }
  }
  EXPECT_THROW(cpu::mx_gemm(4, 4, 0, op, op, c.data(), 4), Error);
}

}  // namespace
}  // namespace moecore::kernels
