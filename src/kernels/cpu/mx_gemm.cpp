#include "kernels/cpu/mx_gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/simd.h"

namespace moecore::kernels::cpu {
namespace {

constexpr int64_t kPanel = 64;  // output columns computed side by side (4 AVX-512 registers)
constexpr int64_t kRows = 4;    // rows of A per panel pass: 16 registers of block sums
// Rows of A decoded at a time (a multiple of kRows): enough that each chunk's panel passes keep
// the threads busy, few enough that the decoded rows stay in L2 (256 x k floats).
constexpr int64_t kChunkRows = 256;

// Scale codes as the kernel keeps them: the exponent code - 127, and for the NaN code a value so
// far outside every real exponent that any sum of two stays out of range and flags the rare path.
constexpr int32_t kNanExponent = 1 << 20;

int32_t scale_exponent(uint8_t code) {
  return code == mx::kE8m0Nan ? kNanExponent : static_cast<int32_t>(code) - mx::kE8m0Bias;
}

// The block sum times Xa * Xb = 2^e, rounded once (as the reference), NaN for a NaN scale.
float scale_block_sum(float sum, int32_t e) {
  if (e >= kNanExponent / 2) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(sum, e);
}

// acc[j] += sum[j] * 2^(exponent_a + exponent_b[j]) for one row's block sums over kWidth columns.
// Scaling by 2^e: for a normal block sum whose result stays normal (or a zero sum) that is adding
// e to the exponent field, exact and the value std::ldexp gives. Done on the bits, not as a
// multiply, so that no compiler can fuse it with the add into an FMA (GCC contracts by default
// even in ISO C++ mode; the build turns that off, and this does not rely on it), which would round
// once where the reference rounds twice. The rest (subnormal or overflowing results, NaN scales,
// Inf / NaN sums) is rare and goes through scale_block_sum. Integer-only and branch-free, so that
// it vectorises.
template <int64_t kWidth = kPanel>
[[gnu::always_inline]] inline void scale_and_accumulate(const float* sum, int32_t exponent_a,
                                                        const int32_t* exponent_b, float* acc) {
  float scaled[kWidth];
  int32_t rare = 0;
  for (int64_t j = 0; j < kWidth; ++j) {
    const int32_t e = exponent_a + exponent_b[j];
    const auto bits = std::bit_cast<uint32_t>(sum[j]);
    const auto exponent = static_cast<int32_t>((bits >> 23) & 0xffu);
    const int32_t zero = static_cast<int32_t>((bits << 1) == 0);
    const int32_t shiftable =
        static_cast<int32_t>(exponent != 0) & static_cast<int32_t>(exponent != 255) &
        static_cast<int32_t>(exponent + e >= 1) & static_cast<int32_t>(exponent + e <= 254);
    rare |=
        static_cast<int32_t>((zero | shiftable) == 0) | static_cast<int32_t>(e >= kNanExponent / 2);
    scaled[j] = std::bit_cast<float>(zero != 0 ? bits : bits + (static_cast<uint32_t>(e) << 23));
  }
  if (rare != 0) {
    for (int64_t j = 0; j < kWidth; ++j) {
      const int32_t e = exponent_a + exponent_b[j];
      const auto bits = std::bit_cast<uint32_t>(sum[j]);
      const auto exponent = static_cast<int32_t>((bits >> 23) & 0xffu);
      const bool shiftable =
          exponent != 0 && exponent != 255 && exponent + e >= 1 && exponent + e <= 254;
      if (e >= kNanExponent / 2 || ((bits << 1) != 0 && !shiftable)) {
        scaled[j] = scale_block_sum(sum[j], e);
      }
    }
  }
  for (int64_t j = 0; j < kWidth; ++j) acc[j] += scaled[j];
}

// kRows rows of C over one panel of kPanel columns: each panel value loaded feeds kRows
// multiply-adds. a_rows: kRows rows of A decoded to fp32 (row stride k); a_exponents: their
// scale_exponent()s (row stride blocks); panel: B's columns decoded and transposed, [k][kPanel];
// panel_exponents: theirs, [blocks][kPanel]; out: [kRows][kPanel]. `sum += a * b` is written
// as an FMA (the build contracts nothing by itself): the product of two MX elements is exact in
// fp32, so the FMA rounds as the add alone does, in half the instructions of the AVX2 and AVX-512
// clones (the baseline clone calls libm's exact fmaf instead, same bits, slower).
MOECORE_SIMD_CLONES
void rows_times_panel(int64_t k, const float* a_rows, const int32_t* a_exponents,
                      const float* panel, const int32_t* panel_exponents, float* out) {
  const int64_t blocks = k / mx::kMxBlock;
  float acc[kRows][kPanel] = {};
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float sum[kRows][kPanel] = {};
    for (int64_t kk = blk * mx::kMxBlock; kk < (blk + 1) * mx::kMxBlock; ++kk) {
      const float* b_values = panel + kk * kPanel;
      for (int64_t r = 0; r < kRows; ++r) {
        const float a_value = a_rows[r * k + kk];
        for (int64_t j = 0; j < kPanel; ++j) sum[r][j] = std::fma(a_value, b_values[j], sum[r][j]);
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      scale_and_accumulate(sum[r], a_exponents[r * blocks + blk], panel_exponents + blk * kPanel,
                           acc[r]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r) std::copy(acc[r], acc[r] + kPanel, out + r * kPanel);
}

#if defined(__x86_64__) && defined(__GNUC__)
// rows_times_panel for CPUs with AVX2 and FMA but not AVX-512, written with intrinsics. The
// generic kernel's 4 rows x 64 columns of block sums are 32 ymm registers on an ISA that has 16,
// so its AVX2 clone kept them on the stack (a load, an FMA from memory and a store for each);
// here the panel is done 16 columns at a time, its 4 x 16 block sums in 8 registers. Each lane is
// still one output column summing k ascending with one fused multiply-add per term (exact products:
// the add's rounding), and the blocks are scaled and added by the same scale_and_accumulate: the
// same bits (ctest's MX GEMM cases compare this CPU's kernel with the scalar reference bit for
// bit).
constexpr int64_t kAvx2Width = 16;

__attribute__((target("avx2,fma"))) void rows_times_panel_avx2(int64_t k, const float* a_rows,
                                                               const int32_t* a_exponents,
                                                               const float* panel,
                                                               const int32_t* panel_exponents,
                                                               float* out) {
  static_assert(kRows == 4 && kPanel % kAvx2Width == 0);
  const int64_t blocks = k / mx::kMxBlock;
  for (int64_t first = 0; first < kPanel; first += kAvx2Width) {
    float acc[kRows][kAvx2Width] = {};
    for (int64_t blk = 0; blk < blocks; ++blk) {
      __m256 s00 = _mm256_setzero_ps(), s01 = s00, s10 = s00, s11 = s00;
      __m256 s20 = s00, s21 = s00, s30 = s00, s31 = s00;
      for (int64_t kk = blk * mx::kMxBlock; kk < (blk + 1) * mx::kMxBlock; ++kk) {
        const float* b = panel + kk * kPanel + first;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        const __m256 a0 = _mm256_broadcast_ss(a_rows + kk);
        s00 = _mm256_fmadd_ps(a0, b0, s00);
        s01 = _mm256_fmadd_ps(a0, b1, s01);
        const __m256 a1 = _mm256_broadcast_ss(a_rows + k + kk);
        s10 = _mm256_fmadd_ps(a1, b0, s10);
        s11 = _mm256_fmadd_ps(a1, b1, s11);
        const __m256 a2 = _mm256_broadcast_ss(a_rows + 2 * k + kk);
        s20 = _mm256_fmadd_ps(a2, b0, s20);
        s21 = _mm256_fmadd_ps(a2, b1, s21);
        const __m256 a3 = _mm256_broadcast_ss(a_rows + 3 * k + kk);
        s30 = _mm256_fmadd_ps(a3, b0, s30);
        s31 = _mm256_fmadd_ps(a3, b1, s31);
      }
      float sum[kRows][kAvx2Width];
      _mm256_storeu_ps(sum[0], s00);
      _mm256_storeu_ps(sum[0] + 8, s01);
      _mm256_storeu_ps(sum[1], s10);
      _mm256_storeu_ps(sum[1] + 8, s11);
      _mm256_storeu_ps(sum[2], s20);
      _mm256_storeu_ps(sum[2] + 8, s21);
      _mm256_storeu_ps(sum[3], s30);
      _mm256_storeu_ps(sum[3] + 8, s31);
      for (int64_t r = 0; r < kRows; ++r) {
        scale_and_accumulate<kAvx2Width>(sum[r], a_exponents[r * blocks + blk],
                                         panel_exponents + blk * kPanel + first, acc[r]);
      }
    }
    for (int64_t r = 0; r < kRows; ++r)
      std::copy(acc[r], acc[r] + kAvx2Width, out + r * kPanel + first);
  }
}

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// The AVX2 kernel where the CPU has AVX2 and FMA but not AVX-512 (where the generic kernel's
// AVX-512 clone keeps its sums in registers).
bool avx2_kernel_is_this_cpus() {
  static const bool use =
      __builtin_cpu_supports("x86-64-v3") && !__builtin_cpu_supports("x86-64-v4");
  return use;
}
#endif

// A's rows and B's column panels decoded to fp32 values and scale exponents.
struct DecodedOperands {
  std::vector<float> a_values;
  std::vector<int32_t> a_exponents;
  std::vector<float> b_panels;
  std::vector<int32_t> b_panel_exponents;
};

}  // namespace

bool mx_gemm_kernel_available(MxGemmKernel kernel) {
  if (kernel != MxGemmKernel::kAvx2) return true;
#if defined(__x86_64__) && defined(__GNUC__)
  return cpu_has_avx2_fma();
#else
  return false;
#endif
}

void mx_gemm(int64_t m, int64_t n, int64_t k, const mx::MxOperand& a, const mx::MxOperand& b,
             float* c, int64_t ldc, MxGemmKernel kernel) {
  mx::check_mx_contraction("mx_gemm", k);
  MOE_CHECK(m >= 0 && n >= 0 && ldc >= n, "[mx_gemm] bad shape m={} n={} ldc={}", m, n, ldc);
  if (m == 0 || n == 0) return;
  const int64_t blocks = k / mx::kMxBlock;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const float* a_table = mx::elem_decode_table(a.elem);
  const float* b_table = mx::elem_decode_table(b.elem);
  MOE_CHECK(mx_gemm_kernel_available(kernel),
            "[mx_gemm] the AVX2 kernel needs a CPU with AVX2 and FMA");
  // The inner kernel, picked once for the call.
  auto* rows_times_panel_kernel = &rows_times_panel;
#if defined(__x86_64__) && defined(__GNUC__)
  if (kernel == MxGemmKernel::kAvx2 ||
      (kernel == MxGemmKernel::kForThisCpu && avx2_kernel_is_this_cpus()))
    rows_times_panel_kernel = &rows_times_panel_avx2;
#endif

  // Decoding is exact, so the kernel sees the reference's values. Rows past m and columns past
  // n are padded with zeros and scale 1 (exponent 0); their outputs are not written.
  // The decoded operands live in buffers of the calling thread that keep their capacity across
  // calls (assign within capacity does not reallocate), so a training step's MX GEMMs ask the
  // heap for nothing once the first step has sized them (tests/alloc); the grouped GEMMs call
  // this from several threads at once, each with its own buffers. A is decoded kChunkRows rows
  // at a time, so A's buffers have one size whatever the rows (an expert's tokens change from
  // step to step, and a thread may meet its first busy expert in any step); B (a weight) has the
  // same shape every step.
  thread_local DecodedOperands decoded;
  std::vector<float>& a_values = decoded.a_values;
  std::vector<int32_t>& a_exponents = decoded.a_exponents;
  std::vector<float>& b_panels = decoded.b_panels;
  std::vector<int32_t>& b_panel_exponents = decoded.b_panel_exponents;
  a_values.reserve(static_cast<size_t>(kChunkRows * k));
  a_exponents.reserve(static_cast<size_t>(kChunkRows * blocks));
  b_panels.assign(static_cast<size_t>(panels * k * kPanel), 0.0f);
  b_panel_exponents.assign(static_cast<size_t>(panels * blocks * kPanel), 0);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = b_panels.data() + p * k * kPanel;
    int32_t* exponents = b_panel_exponents.data() + p * blocks * kPanel;
    for (int64_t j = p * kPanel; j < std::min(n, (p + 1) * kPanel); ++j) {
      const int64_t lane = j - p * kPanel;
      for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanel + lane] = b_table[b.codes[j * k + kk]];
      for (int64_t blk = 0; blk < blocks; ++blk) {
        exponents[blk * kPanel + lane] = scale_exponent(b.scales[j * blocks + blk]);
      }
    }
  }
  for (int64_t first = 0; first < m; first += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, m - first);
    const int64_t row_groups = (rows + kRows - 1) / kRows;
    a_values.assign(static_cast<size_t>(row_groups * kRows * k), 0.0f);
    a_exponents.assign(static_cast<size_t>(row_groups * kRows * blocks), 0);
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t row = first + i;
        for (int64_t kk = 0; kk < k; ++kk) a_values[i * k + kk] = a_table[a.codes[row * k + kk]];
        for (int64_t blk = 0; blk < blocks; ++blk) {
          a_exponents[i * blocks + blk] = scale_exponent(a.scales[row * blocks + blk]);
        }
      }
      // Consecutive work items share a panel, so a thread keeps its panel in cache across rows.
#pragma omp for collapse(2) schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        for (int64_t g = 0; g < row_groups; ++g) {
          float out[kRows * kPanel];
          const float* a_group = a_values.data() + g * kRows * k;
          const int32_t* a_group_exponents = a_exponents.data() + g * kRows * blocks;
          const float* b_panel = b_panels.data() + p * k * kPanel;
          const int32_t* b_exponents = b_panel_exponents.data() + p * blocks * kPanel;
          rows_times_panel_kernel(k, a_group, a_group_exponents, b_panel, b_exponents, out);
          const int64_t width = std::min(kPanel, n - p * kPanel);
          for (int64_t r = 0; r < std::min(kRows, rows - g * kRows); ++r) {
            std::copy(out + r * kPanel, out + r * kPanel + width,
                      c + (first + g * kRows + r) * ldc + p * kPanel);
          }
        }
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
