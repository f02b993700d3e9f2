// OCP Microscaling (MX) v1.0 types: FP8 elements (E4M3, E5M2), the E8M0 block scale, and block
// quantisation along the contraction dimension (blocks of kMxBlock consecutive values share one
// scale). Everything here works on raw pointers and sizes so that a tensor view can wrap it.
//
// Elements. E4M3: bias 7, no infinities, S.1111.111 is NaN, largest finite 448. E5M2: bias 15,
// IEEE-like (S.11111.00 is Inf, S.11111.xx NaN), largest finite 57344. Encoding rounds to nearest,
// ties to even, and saturates: anything beyond the largest finite value, infinities included,
// becomes +-max (the `satfinite` conversion of GPU kernels and torchao); NaN becomes 0x7f with the
// input's sign (PyTorch's NaN code for both types).
//
// Scale. E8M0 code c is the power of two 2^(c - 127) for c in 0..254 (2^-127 .. 2^127); 255 is NaN
// and makes every element of its block NaN.
//
// Block scale X from amax = max |V_i| of the block (NaN when any V_i is NaN):
//  - rceil (default, OLMo-core 3 / cuBLAS / Blackwell's cvt.rp.satfinite.ue8m0x2.f32): the smallest
//    power of two X with amax / X <= max_elem, i.e. amax / max_elem rounded up exactly to a power
//    of two (the value itself when it already is one), clamped to [2^-127, 2^127]; an infinite
//    amax saturates to 2^127 (code 254).
//  - floor (OCP MX v1.0, section 6.3): X = 2^(floor(log2 amax) - emax_elem) with floor(log2 amax)
//    read from amax's fp32 exponent bits (emax_elem = 8 for E4M3, 15 for E5M2), clamped to
//    2^-127 from below. Elements may exceed max_elem by up to 2x and saturate. An infinite amax
//    has exponent bits 255, i.e. "2^128", so X = 2^(128 - emax_elem), as the OCP reference code
//    and torchao compute it.
// Elements P_i = encode(V_i / X), computed as one fp32 multiply by the power of two 1/X (exact
// unless the product falls into fp32's subnormal range, where it is far below half the smallest
// element subnormal and encodes to +-0 either way). A NaN-scale block is encoded by the same rule
// with X read as 2^128: its elements carry no value.
#pragma once

#include <cstdint>
#include <string_view>

namespace moecore::mx {

// Values per shared scale, along the contraction dimension (OCP MX v1.0's k for MXFP8).
inline constexpr int64_t kMxBlock = 32;
inline constexpr uint8_t kE8m0Nan = 255;
inline constexpr int kE8m0Bias = 127;

enum class ElemType : uint8_t { kE4M3, kE5M2 };
enum class ScaleMode : uint8_t { kRceil, kFloor };

std::string_view elem_type_name(ElemType type);
std::string_view scale_mode_name(ScaleMode mode);
// "e4m3" / "e5m2" and "rceil" / "floor"; anything else is an error naming `what` and the text.
ElemType parse_elem_type(std::string_view text, std::string_view what);
ScaleMode parse_scale_mode(std::string_view text, std::string_view what);

// The exponent of the largest power of two an element type represents (8 for E4M3, 15 for E5M2)
// and its largest finite value.
int elem_emax(ElemType type);
float elem_max(ElemType type);

// Elements: fp32 <-> code. decode_elem is exact; encode_elem rounds as described above.
float decode_elem(ElemType type, uint8_t code);
uint8_t encode_elem(ElemType type, float value);
// The 256 decoded values of a type, indexed by code (for loops that decode many codes).
const float* elem_decode_table(ElemType type);

// Scales: 2^(code - 127), NaN for 255. Exact (code 0 is the fp32 subnormal 2^-127).
float decode_e8m0(uint8_t code);
// The scale code of a block whose largest magnitude is `amax` (NaN if the block holds a NaN).
uint8_t block_scale_code(ElemType type, ScaleMode mode, float amax);

// An error naming `op` unless k is a positive multiple of kMxBlock: MX needs whole blocks along
// the contraction dimension, and nothing falls back to another precision silently.
void check_mx_contraction(std::string_view op, int64_t k);

// Quantises x [rows, cols] (row stride ldx, contiguous along cols, the contraction dimension)
// into codes [rows, cols] (contiguous) and scales [rows, cols / kMxBlock] (one per block).
void quantize(ElemType type, ScaleMode mode, int64_t rows, int64_t cols, const float* x,
              int64_t ldx, uint8_t* codes, uint8_t* scales);
// The inverse map: x[r, c] = decode_elem(codes[r, c]) * decode_e8m0(scales[r, c / kMxBlock]),
// one fp32 multiply (exact, or the correctly rounded value where it leaves fp32's range).
void dequantize(ElemType type, int64_t rows, int64_t cols, const uint8_t* codes,
                const uint8_t* scales, float* x);

// An operand of an MX GEMM as quantize() writes it: codes [rows, k] (contiguous) and scales
// [rows, k / kMxBlock], quantised along k.
struct MxOperand {
  ElemType elem = ElemType::kE4M3;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
};

}  // namespace moecore::mx
