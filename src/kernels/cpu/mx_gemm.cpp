#include "kernels/cpu/mx_gemm.h"

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
constexpr int kScaleBias2 = 2 * mx::kE8m0Bias;

// The block sum times Xa * Xb = 2^(scale_a + scale_b - 254), rounded once (as the reference).
float scale_block_sum(float sum, int scale_a, int scale_b) {
  if (scale_a == mx::kE8m0Nan || scale_b == mx::kE8m0Nan) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  return std::ldexp(sum, scale_a + scale_b - kScaleBias2);
}

// One row of C over one panel of kPanel columns. a_row: the row of A decoded to fp32 [k];
// a_scales: its scale codes [blocks]; panel: B's columns decoded and transposed, [k][kPanel];
// panel_scales: their scale codes, [blocks][kPanel].
MOECORE_SIMD_CLONES
void row_times_panel(int64_t blocks, const float* a_row, const uint8_t* a_scales,
                     const float* panel, const uint8_t* panel_scales, float* out) {
  float acc[kPanel] = {};
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float sum[kPanel] = {};
    for (int64_t kk = blk * mx::kMxBlock; kk < (blk + 1) * mx::kMxBlock; ++kk) {
      const float a_value = a_row[kk];
      const float* b_values = panel + kk * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) sum[j] += a_value * b_values[j];
    }
    // Scaling by a power of two 2^e with e in fp32's normal range is one exactly rounded multiply,
    // the same value std::ldexp gives; the rest (extreme exponents, NaN scales) is rare and goes
    // through scale_block_sum.
    const int scale_a = a_scales[blk];
    const uint8_t* scale_b = panel_scales + blk * kPanel;
    float scaled[kPanel];
    int rare = scale_a == mx::kE8m0Nan ? 1 : 0;
    for (int64_t j = 0; j < kPanel; ++j) {
      const int e = scale_a + scale_b[j] - kScaleBias2;
      rare |= static_cast<int>(e < -126 || e > 127 || scale_b[j] == mx::kE8m0Nan);
      const auto power =
          std::bit_cast<float>(static_cast<uint32_t>(std::clamp(e, -126, 127) + 127) << 23);
      scaled[j] = sum[j] * power;
    }
    if (rare != 0) {
      for (int64_t j = 0; j < kPanel; ++j) {
        const int e = scale_a + scale_b[j] - kScaleBias2;
        if (e < -126 || e > 127 || scale_a == mx::kE8m0Nan || scale_b[j] == mx::kE8m0Nan) {
          scaled[j] = scale_block_sum(sum[j], scale_a, scale_b[j]);
        }
      }
    }
    for (int64_t j = 0; j < kPanel; ++j) acc[j] += scaled[j];
  }
  std::copy(acc, acc + kPanel, out);
}

}  // namespace

void mx_gemm(int64_t m, int64_t n, int64_t k, const mx::MxOperand& a, const mx::MxOperand& b,
             float* c, int64_t ldc) {
  mx::check_mx_contraction("mx_gemm", k);
  MOE_CHECK(m >= 0 && n >= 0 && ldc >= n, "[mx_gemm] bad shape m={} n={} ldc={}", m, n, ldc);
  if (m == 0 || n == 0) return;
  const int64_t blocks = k / mx::kMxBlock;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const float* a_table = mx::elem_decode_table(a.elem);
  const float* b_table = mx::elem_decode_table(b.elem);

  // Decoding is exact, so the kernel sees the reference's values. Columns past n are padded with
  // zeros and scale 1 (code 127); their outputs are not written.
  std::vector<float> a_values(static_cast<size_t>(m * k));
  std::vector<float> b_panels(static_cast<size_t>(panels * k * kPanel), 0.0f);
  std::vector<uint8_t> b_panel_scales(static_cast<size_t>(panels * blocks * kPanel),
                                      static_cast<uint8_t>(mx::kE8m0Bias));
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) a_values[i * k + kk] = a_table[a.codes[i * k + kk]];
    }
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      float* panel = b_panels.data() + p * k * kPanel;
      uint8_t* scales = b_panel_scales.data() + p * blocks * kPanel;
      for (int64_t j = p * kPanel; j < std::min(n, (p + 1) * kPanel); ++j) {
        const int64_t lane = j - p * kPanel;
        for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanel + lane] = b_table[b.codes[j * k + kk]];
        for (int64_t blk = 0; blk < blocks; ++blk) {
          scales[blk * kPanel + lane] = b.scales[j * blocks + blk];
        }
      }
    }
    // Consecutive work items share a panel, so a thread keeps its panel in cache across rows.
#pragma omp for collapse(2) schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t i = 0; i < m; ++i) {
        float out[kPanel];
        row_times_panel(blocks, a_values.data() + i * k, a.scales + i * blocks,
                        b_panels.data() + p * k * kPanel,
                        b_panel_scales.data() + p * blocks * kPanel, out);
        const int64_t width = std::min(kPanel, n - p * kPanel);
        std::copy(out, out + width, c + i * ldc + p * kPanel);
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
