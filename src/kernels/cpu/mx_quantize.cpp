// MX quantisation on the CPU, bit-identical to the rules of core/mx_types.h (the reference,
// kernels/reference/mx_quantize.cpp, applies mx::encode_elem element by element). Here a block of
// 32 runs branch-free so that it vectorises (compiled per ISA, core/simd.h): amax as an integer
// max over the magnitudes' bits (for non-NaN floats their order is the order of the bits, and any
// NaN's bits exceed Inf's, so one max also flags a NaN block), the scale from
// mx::block_scale_code once per block, and each element encoded by both of encode_elem's paths
// with a select instead of a branch.
//
// The transposed orientation reads x in tiles of 32 rows x 64 columns (32 runs of 256 contiguous
// bytes), transposes each tile into a small buffer and quantises its 64 columns as rows with the
// same routine; x^T is never materialised.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cpu {

namespace {

constexpr int64_t kTileCols = 64;  // columns of x per transposed tile (one 256-byte run per row)

// An FP8 element format as encode_elem rounds to it (core/mx_types.cpp): mantissa bits, exponent
// bias, the code of the largest finite magnitude.
template <int kMantissaBits, int kBias, uint32_t kMaxCode>
struct Fp8Format {
  static constexpr int mantissa_bits = kMantissaBits;
  static constexpr int bias = kBias;
  static constexpr uint32_t max_code = kMaxCode;
};
using E4m3 = Fp8Format<3, 7, 0x7e>;
using E5m2 = Fp8Format<2, 15, 0x7b>;

// codes[i] = encode_elem(v[i] * inverse_scale) for one block, without branches.
template <typename F>
[[gnu::always_inline]] inline void encode_block(const float* v, float inverse_scale,
                                                uint8_t* codes) {
  constexpr int kShift = 23 - F::mantissa_bits;
  constexpr uint32_t kHalfMinusOne = (1u << (kShift - 1)) - 1u;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - F::bias) << F::mantissa_bits;
  // Below the smallest normal element, 2^(1 - bias), the codes are the multiples of
  // 2^(1 - bias - mantissa_bits): scaled by the inverse (exact), rounded to an integer (< 2^mb)
  // ties to even by the 2^23 trick of the default rounding mode.
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - F::bias) << 23;
  const float min_normal = std::bit_cast<float>(kMinNormalBits);
  const float to_subnormal_units =
      std::bit_cast<float>(static_cast<uint32_t>(127 + F::bias - 1 + F::mantissa_bits) << 23);
  constexpr float kRoundingMagic = 8388608.0f;  // 2^23
  for (int64_t i = 0; i < mx::kMxBlock; ++i) {
    const auto bits = std::bit_cast<uint32_t>(v[i] * inverse_scale);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t abs_bits = bits & 0x7fffffffu;
    const float magnitude = std::bit_cast<float>(abs_bits);
    // Clamped (NaN included) so that the conversion below stays in range on every lane.
    const float small = magnitude < min_normal ? magnitude : min_normal;
    const float units = (small * to_subnormal_units + kRoundingMagic) - kRoundingMagic;
    const auto subnormal_code = static_cast<uint32_t>(static_cast<int32_t>(units));
    const uint32_t normal_code =
        ((abs_bits + kHalfMinusOne + ((abs_bits >> kShift) & 1u)) >> kShift) - kRebias;
    uint32_t code = abs_bits < kMinNormalBits ? subnormal_code : normal_code;
    code = code < F::max_code ? code : F::max_code;
    code = abs_bits > 0x7f800000u ? 0x7fu : code;
    codes[i] = static_cast<uint8_t>(sign | code);
  }
}

// The largest |v[i]| of one block as fp32 bits (> 0x7f800000: the block holds a NaN).
[[gnu::always_inline]] inline uint32_t block_amax_bits(const float* v) {
  uint32_t lanes[16] = {};
  for (int64_t j = 0; j < mx::kMxBlock; j += 16)
    for (int64_t l = 0; l < 16; ++l) {
      const uint32_t abs_bits = std::bit_cast<uint32_t>(v[j + l]) & 0x7fffffffu;
      lanes[l] = abs_bits > lanes[l] ? abs_bits : lanes[l];
    }
  uint32_t amax = 0;
  for (const uint32_t lane : lanes) amax = lane > amax ? lane : amax;
  return amax;
}

// One row of cols values (a multiple of 32) -> cols codes and cols / 32 scales.
template <typename F>
[[gnu::always_inline]] inline void quantize_row_as(mx::ElemType elem, mx::ScaleMode mode,
                                                   int64_t cols, const float* x, uint8_t* codes,
                                                   uint8_t* scales) {
  for (int64_t b = 0; b < cols / mx::kMxBlock; ++b) {
    const float* v = x + b * mx::kMxBlock;
    const uint8_t scale =
        mx::block_scale_code(elem, mode, std::bit_cast<float>(block_amax_bits(v)));
    scales[b] = scale;
    // 1 / X = 2^(127 - code): 2^127 .. 2^-128 (code 255 read as 2^128), all exact in fp32.
    encode_block<F>(v, std::ldexp(1.0f, mx::kE8m0Bias - static_cast<int>(scale)),
                    codes + b * mx::kMxBlock);
  }
}

MOECORE_SIMD_CLONES
void quantize_row(mx::ElemType elem, mx::ScaleMode mode, int64_t cols, const float* x,
                  uint8_t* codes, uint8_t* scales) {
  if (elem == mx::ElemType::kE4M3)
    quantize_row_as<E4m3>(elem, mode, cols, x, codes, scales);
  else
    quantize_row_as<E5m2>(elem, mode, cols, x, codes, scales);
}

}  // namespace

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize", x, codes, scales, false);
  const int64_t rows = q.x.batch * q.x.rows, cols = q.x.cols, blocks = cols / mx::kMxBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(q.elem, mode, cols, q.values + r * cols, q.codes + r * cols,
                 q.scales + r * blocks);
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize_transposed", x, codes, scales, true);
  const int64_t rows = q.x.rows, cols = q.x.cols;
  const int64_t row_blocks = rows / mx::kMxBlock;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
#pragma omp parallel for collapse(3) \
    schedule(static) if (q.x.batch * rows * cols >= (int64_t{1} << 16))
  for (int64_t b = 0; b < q.x.batch; ++b) {
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      for (int64_t t = 0; t < col_tiles; ++t) {
        const int64_t c0 = t * kTileCols, width = std::min(kTileCols, cols - c0);
        const float* src = q.values + (b * rows + rb * mx::kMxBlock) * cols + c0;
        float tile[kTileCols * mx::kMxBlock];  // [column][row of the block]
        for (int64_t i = 0; i < mx::kMxBlock; ++i)
          for (int64_t c = 0; c < width; ++c) tile[c * mx::kMxBlock + i] = src[i * cols + c];
        for (int64_t c = 0; c < width; ++c) {
          const int64_t column = b * cols + c0 + c;  // row of the transposed output
          quantize_row(q.elem, mode, mx::kMxBlock, tile + c * mx::kMxBlock,
                       q.codes + column * rows + rb * mx::kMxBlock,
                       q.scales + column * row_blocks + rb);
        }
      }
    }
  }
}

}  // namespace moecore::kernels::cpu
