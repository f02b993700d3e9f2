// The per-op harness (kernel_harness.h) for the MX ops of kernels/ops.h: every registered backend
// against the plain-loop oracle on random shapes, odd row and column counts included, both element
// types and both scale modes. The comparison is bit for bit: quantisation is a fixed rounding rule
// per element and the MX GEMM is exact in a fixed summation order (kernels/reference/mx_gemm.h),
// so any difference at all is a bug (NaN payloads aside: NaN matches NaN). The one exception is
// the MX GEMMs of a backend whose table says !mx_gemm_bit_exact (the CUDA backend on Hopper sums
// the same products in cuBLASLt's order): those compare by NMSE (expect_gemm_matches).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "kernel_harness.h"

namespace moecore {
namespace {

using kernel_harness::backend_name;
using kernel_harness::offsets_view;
using kernel_harness::oracle;
using kernels::KernelBackend;
using mx::ElemType;
using mx::ScaleMode;

DType code_dtype(ElemType elem) {
  return elem == ElemType::kE4M3 ? DType::kE4m3 : DType::kE5m2;
}

std::string elem_and_mode(ElemType elem, ScaleMode mode) {
  return std::string(mx::elem_type_name(elem)) + " " + std::string(mx::scale_mode_name(mode));
}

// n values whose magnitudes vary by up to 2^12 either way between runs of 8 (so that the blocks of
// 32 get different scales and elements of one block differ in exponent). With `specials`, a zero
// run, an fp32 subnormal, an Inf and a NaN land at seeded places (the rare paths of the scale
// rule and the encoder).
std::vector<float> mx_values(size_t n, uint32_t seed, bool specials) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> shift(-12, 12);
  std::vector<float> x(n);
  int run_shift = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) run_shift = shift(gen);
    x[i] = std::ldexp(normal(gen), run_shift);
  }
  if (specials && n >= 64) {
    std::uniform_int_distribution<size_t> at(0, n - 1);
    const size_t zero_run = at(gen) / 8 * 8;
    for (size_t i = zero_run; i < std::min(n, zero_run + 8); ++i) x[i] = 0.0f;
    x[at(gen)] = std::numeric_limits<float>::denorm_min() * 37.0f;
    x[at(gen)] = -std::numeric_limits<float>::infinity();
    x[at(gen)] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

// Same bits, or both NaN.
void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " index " << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << what << " index " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

// An MX GEMM's output against the oracle's (or another run's), contracting over k: bit for bit
// where the backend's MX GEMMs are (mx_gemm_bit_exact), else by NMSE within
// kernel_harness::nmse_bound(k). The bound: each product of two dequantised elements is exact in
// fp32 (at most 4 x 4 significant bits times powers of two), so both results are fp32 sums of the
// same k exact terms, in different orders (the reference block by block, cuBLASLt in its tiles),
// each within k u sum|t| <= k^1.5 u ||t||_2 of the exact sum (u = 2^-24) -- nmse_bound's
// derivation (tests/TOLERANCES.md). Their difference is at most twice that, and nmse_bound's
// factor 4 on the error covers the 2, the epilogue's roundings (alpha p + beta c) and the tensor
// cores' coarser rounding of partial sums. A NaN where the reference has a number makes the NMSE
// NaN, which fails too; a wrong kernel (an index off by one, a wrong scale) gives NMSE ~ 1e-2 ..
// 1, against a bound of 4e-9 (k = 32) .. 3e-7 (k = 160).
void expect_gemm_matches(const KernelBackend& backend, const std::vector<float>& got,
                         const std::vector<float>& want, int64_t k, const std::string& what) {
  if (backend.mx_gemm_bit_exact) {
    expect_same_floats(got, want, what);
    return;
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(kernel_harness::nmse(got, want), kernel_harness::nmse_bound(k)) << what;
}

// An MX tensor held in vectors: codes of `shape`, scales of shape with the last extent / 32.
struct MxBuffers {
  ElemType elem;
  std::vector<int64_t> shape;
  std::vector<uint8_t> codes, scales;

  MxBuffers(ElemType elem_type, std::vector<int64_t> codes_shape)
      : elem(elem_type), shape(std::move(codes_shape)) {
    int64_t n = 1;
    for (const int64_t extent : shape) n *= extent;
    codes.assign(static_cast<size_t>(n), 0);
    scales.assign(static_cast<size_t>(n / mx::kMxBlock), 0);
  }
  TensorView codes_view() { return make(codes.data(), shape, code_dtype(elem)); }
  TensorView scales_view() {
    std::vector<int64_t> s = shape;
    s.back() /= mx::kMxBlock;
    return make(scales.data(), s, DType::kE8m0);
  }
  MxOperandView operand() { return {codes_view(), scales_view()}; }

  static TensorView make(void* data, const std::vector<int64_t>& s, DType dtype) {
    if (s.size() == 2) return {data, {s[0], s[1]}, dtype};
    return {data, {s[0], s[1], s[2]}, dtype};
  }
};

TensorView f32_view(std::vector<float>& v, const std::vector<int64_t>& shape) {
  return MxBuffers::make(v.data(), shape, DType::kF32);
}

// The error of f(), which must throw a one-line moecore::Error containing `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "shape";
  for (const int64_t extent : shape) {
    text += ' ';
    text += std::to_string(extent);
  }
  return text;
}

constexpr ElemType kElems[] = {ElemType::kE4M3, ElemType::kE5M2};
constexpr ScaleMode kScaleModes[] = {ScaleMode::kRceil, ScaleMode::kFloor};

class MxKernelOps : public ::testing::TestWithParam<const KernelBackend*> {
 protected:
  const KernelBackend& backend() const { return *GetParam(); }
};

// mx_quantize and mx_dequantize along the last dimension: odd row counts, one block and several,
// matrices and a batch of matrices.
TEST_P(MxKernelOps, QuantizeAndDequantizeMatchReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_quantize, backend().mx_dequantize);
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 32}, {3, 64}, {33, 96}, {7, 160}, {3, 5, 64}};
  uint32_t seed = 2000;
  for (const auto& shape : shapes)
    for (const ElemType elem : kElems)
      for (const ScaleMode mode : kScaleModes) {
        const std::string what = elem_and_mode(elem, mode) + " " + shape_text(shape);
        int64_t n = 1;
        for (const int64_t extent : shape) n *= extent;
        std::vector<float> x = mx_values(static_cast<size_t>(n), ++seed, true);
        MxBuffers got(elem, shape), want(elem, shape);
        backend().mx_quantize(f32_view(x, shape), mode, got.codes_view(), got.scales_view());
        oracle().mx_quantize(f32_view(x, shape), mode, want.codes_view(), want.scales_view());
        EXPECT_EQ(got.codes, want.codes) << "codes " << what;
        EXPECT_EQ(got.scales, want.scales) << "scales " << what;

        std::vector<float> back(x.size()), back_ref(x.size());
        backend().mx_dequantize(want.operand(), f32_view(back, shape));
        oracle().mx_dequantize(want.operand(), f32_view(back_ref, shape));
        expect_same_floats(back, back_ref, "dequantize " + what);
        // Into bf16 (a bf16 GEMM's operand): float_to_bf16 of the fp32 values, bit for bit.
        std::vector<uint16_t> rounded(x.size()), back16(x.size()), back16_ref(x.size());
        std::transform(back_ref.begin(), back_ref.end(), rounded.begin(), float_to_bf16);
        backend().mx_dequantize(want.operand(),
                                MxBuffers::make(back16.data(), shape, DType::kBf16));
        oracle().mx_dequantize(want.operand(),
                               MxBuffers::make(back16_ref.data(), shape, DType::kBf16));
        EXPECT_EQ(back16, rounded) << "dequantize to bf16 " << what;
        EXPECT_EQ(back16_ref, rounded) << "oracle dequantize to bf16 " << what;
      }
}

// The rounding itself: blocks whose scale is 1 in both modes (each starts with the element type's
// largest finite value, amax / max = 1) filled with the midpoints between consecutive codes (ties,
// to even), the floats on either side of each, both signs, subnormal elements included.
TEST_P(MxKernelOps, QuantizeRoundsTiesAsTheReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_quantize);
  for (const ElemType elem : kElems)
    for (const ScaleMode mode : kScaleModes) {
      const float* decoded = mx::elem_decode_table(elem);
      const float largest = mx::elem_max(elem);
      std::vector<float> values;
      for (int c = 0; decoded[c + 1] <= largest; ++c) {
        const float mid = 0.5f * (decoded[c] + decoded[c + 1]);  // exact: <= 5 significant bits
        const float sign = c % 2 == 0 ? 1.0f : -1.0f;
        values.push_back(sign * mid);
        values.push_back(-sign * std::nextafter(mid, 0.0f));
        values.push_back(sign * std::nextafter(mid, largest));
      }
      const int64_t rows = static_cast<int64_t>(values.size() + 30) / 31;
      std::vector<float> x(static_cast<size_t>(rows * mx::kMxBlock), 0.0f);
      for (size_t i = 0; i < values.size(); ++i) x[i / 31 * 32 + 1 + i % 31] = values[i];
      for (int64_t r = 0; r < rows; ++r) x[static_cast<size_t>(r * mx::kMxBlock)] = largest;
      MxBuffers got(elem, {rows, mx::kMxBlock}), want(elem, {rows, mx::kMxBlock});
      backend().mx_quantize(f32_view(x, {rows, mx::kMxBlock}), mode, got.codes_view(),
                            got.scales_view());
      oracle().mx_quantize(f32_view(x, {rows, mx::kMxBlock}), mode, want.codes_view(),
                           want.scales_view());
      const std::string what = elem_and_mode(elem, mode);
      for (const uint8_t scale : want.scales) ASSERT_EQ(scale, mx::kE8m0Bias) << what;
      EXPECT_EQ(got.codes, want.codes) << "codes " << what;
      EXPECT_EQ(got.scales, want.scales) << "scales " << what;
    }
}

// mx_quantize_transposed: blocks of 32 rows per column, written [cols, rows]. Besides the oracle,
// it must equal mx_quantize of x^T (transposed in fp32, which is exact): the same blocks, the
// same rule.
TEST_P(MxKernelOps, QuantizeTransposedMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_quantize_transposed, backend().mx_quantize);
  const std::vector<std::vector<int64_t>> shapes = {{32, 1},  {64, 33},  {96, 7},
                                                    {32, 67}, {32, 130}, {3, 64, 5}};
  uint32_t seed = 2100;
  for (const auto& shape : shapes)
    for (const ElemType elem : kElems)
      for (const ScaleMode mode : kScaleModes) {
        const std::string what = elem_and_mode(elem, mode) + " " + shape_text(shape);
        const int64_t batch = shape.size() == 3 ? shape[0] : 1;
        const int64_t rows = shape[shape.size() - 2], cols = shape.back();
        std::vector<float> x = mx_values(static_cast<size_t>(batch * rows * cols), ++seed, true);
        std::vector<int64_t> transposed_shape = shape;
        std::swap(transposed_shape[shape.size() - 2], transposed_shape.back());
        MxBuffers got(elem, transposed_shape), want(elem, transposed_shape);
        backend().mx_quantize_transposed(f32_view(x, shape), mode, got.codes_view(),
                                         got.scales_view());
        oracle().mx_quantize_transposed(f32_view(x, shape), mode, want.codes_view(),
                                        want.scales_view());
        EXPECT_EQ(got.codes, want.codes) << "codes " << what;
        EXPECT_EQ(got.scales, want.scales) << "scales " << what;

        std::vector<float> xt(x.size());
        for (int64_t m = 0; m < batch; ++m)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              xt[static_cast<size_t>((m * cols + c) * rows + r)] =
                  x[static_cast<size_t>((m * rows + r) * cols + c)];
        MxBuffers of_transpose(elem, transposed_shape);
        backend().mx_quantize(f32_view(xt, transposed_shape), mode, of_transpose.codes_view(),
                              of_transpose.scales_view());
        EXPECT_EQ(got.codes, of_transpose.codes) << "codes vs quantize(x^T) " << what;
        EXPECT_EQ(got.scales, of_transpose.scales) << "scales vs quantize(x^T) " << what;
      }
}

// mx_matmul on odd M and N, several K, equal and mixed element types, and the epilogue's cases
// (beta = 0 must not read c: it starts as NaN there); one N a multiple of 4 (17 x 32 x 96), the
// shape the CUDA backend's block-scaled path takes on Blackwell (the others take its bf16 path).
TEST_P(MxKernelOps, MatmulMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_matmul);
  struct Case {
    int64_t m, n, k;
  };
  struct Epilogue {
    float alpha, beta;
  };
  const ElemType pairs[][2] = {{ElemType::kE4M3, ElemType::kE4M3},
                               {ElemType::kE5M2, ElemType::kE4M3},
                               {ElemType::kE4M3, ElemType::kE5M2}};
  uint32_t seed = 2200;
  for (const Case c : {Case{1, 1, 32}, Case{3, 5, 64}, Case{17, 33, 96}, Case{17, 32, 96},
                       Case{2, 67, 160}, Case{65, 1, 32}})
    for (const auto& pair : pairs)
      for (const ScaleMode mode : kScaleModes) {
        const std::string what =
            "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
            " " + std::string(mx::elem_type_name(pair[0])) + " x " + elem_and_mode(pair[1], mode);
        std::vector<float> a = mx_values(static_cast<size_t>(c.m * c.k), ++seed, false);
        std::vector<float> b = mx_values(static_cast<size_t>(c.n * c.k), ++seed, false);
        MxBuffers qa(pair[0], {c.m, c.k}), qb(pair[1], {c.n, c.k});
        oracle().mx_quantize(f32_view(a, {c.m, c.k}), mode, qa.codes_view(), qa.scales_view());
        oracle().mx_quantize(f32_view(b, {c.n, c.k}), mode, qb.codes_view(), qb.scales_view());
        const std::vector<float> c_before =
            mx_values(static_cast<size_t>(c.m * c.n), ++seed, false);
        for (const Epilogue ep : {Epilogue{1.0f, 0.0f}, Epilogue{0.5f, 0.0f}, Epilogue{1.0f, 1.0f},
                                  Epilogue{-0.375f, 0.75f}}) {
          std::vector<float> got = c_before, want = c_before;
          if (ep.beta == 0.0f) {
            std::fill(got.begin(), got.end(), std::numeric_limits<float>::quiet_NaN());
            std::fill(want.begin(), want.end(), std::numeric_limits<float>::quiet_NaN());
          }
          backend().mx_matmul(qa.operand(), qb.operand(), ep.alpha, ep.beta,
                              f32_view(got, {c.m, c.n}));
          oracle().mx_matmul(qa.operand(), qb.operand(), ep.alpha, ep.beta,
                             f32_view(want, {c.m, c.n}));
          const std::string case_what =
              what + " alpha=" + std::to_string(ep.alpha) + " beta=" + std::to_string(ep.beta);
          expect_gemm_matches(backend(), got, want, c.k, "mx_matmul " + case_what);
          for (const float v : got) ASSERT_FALSE(std::isnan(v)) << "c was read: " << case_what;
        }
      }
}

// The grouped MX GEMMs: empty experts at either end and in the middle, one expert, and enough
// small experts that the CPU backend runs them in parallel, and experts big enough that it runs
// them one at a time with threaded GEMMs (both ways of kernels/cpu/expert_parallel_for.h).
// Each expert's rows must also equal mx_matmul on that expert's slices. The input gradient runs
// where out is a multiple of 32 (its contraction dimension).
TEST_P(MxKernelOps, GroupedGemmMatchesReference) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_grouped_gemm_forward,
                                  backend().mx_grouped_gemm_backward_input, backend().mx_matmul);
  struct Case {
    std::vector<int64_t> rows_per_expert;
    int64_t out, in;
  };
  const std::vector<Case> cases = {{{3, 0, 5}, 7, 32},         {{1}, 32, 32},
                                   {{0, 17, 2, 0}, 64, 96},    {{4, 6, 1, 9, 3, 7, 2, 5}, 32, 64},
                                   {{40, 300, 0, 33}, 17, 64}, {{300, 0, 260}, 32, 32}};
  uint32_t seed = 2300;
  for (const Case& c : cases)
    for (const ScaleMode mode : kScaleModes) {
      const int64_t experts = static_cast<int64_t>(c.rows_per_expert.size());
      const int64_t out = c.out, in = c.in;
      std::vector<int64_t> offsets = {0};
      for (const int64_t r : c.rows_per_expert) offsets.push_back(offsets.back() + r);
      const int64_t rows = offsets.back();
      const std::string what = "E=" + std::to_string(experts) + " R=" + std::to_string(rows) +
                               " out=" + std::to_string(out) + " in=" + std::to_string(in) + " " +
                               std::string(mx::scale_mode_name(mode));
      std::vector<float> x = mx_values(static_cast<size_t>(rows * in), ++seed, false);
      std::vector<float> w = mx_values(static_cast<size_t>(experts * out * in), ++seed, false);
      MxBuffers qx(ElemType::kE4M3, {rows, in}), qw(ElemType::kE4M3, {experts, out, in});
      oracle().mx_quantize(f32_view(x, {rows, in}), mode, qx.codes_view(), qx.scales_view());
      oracle().mx_quantize(f32_view(w, {experts, out, in}), mode, qw.codes_view(),
                           qw.scales_view());
      std::vector<float> y(static_cast<size_t>(rows * out), 0.0f), y_ref = y;
      backend().mx_grouped_gemm_forward(qx.operand(), qw.operand(), offsets_view(offsets),
                                        f32_view(y, {rows, out}));
      oracle().mx_grouped_gemm_forward(qx.operand(), qw.operand(), offsets_view(offsets),
                                       f32_view(y_ref, {rows, out}));
      expect_gemm_matches(backend(), y, y_ref, in, "mx_grouped_gemm_forward " + what);
      for (int64_t e = 0; e < experts; ++e) {
        const int64_t begin = offsets[static_cast<size_t>(e)];
        const int64_t count = offsets[static_cast<size_t>(e + 1)] - begin;
        if (count == 0) continue;
        const auto blocks = in / mx::kMxBlock;
        const MxOperandView xe{
            ConstTensorView(qx.codes.data() + begin * in, {count, in}, DType::kE4m3),
            ConstTensorView(qx.scales.data() + begin * blocks, {count, blocks}, DType::kE8m0)};
        const MxOperandView we{
            ConstTensorView(qw.codes.data() + e * out * in, {out, in}, DType::kE4m3),
            ConstTensorView(qw.scales.data() + e * out * blocks, {out, blocks}, DType::kE8m0)};
        std::vector<float> ye(static_cast<size_t>(count * out));
        backend().mx_matmul(xe, we, 1.0f, 0.0f, f32_view(ye, {count, out}));
        const std::vector<float> rows_of_e(y.begin() + begin * out,
                                           y.begin() + (begin + count) * out);
        expect_gemm_matches(backend(), rows_of_e, ye, in,
                            "expert " + std::to_string(e) + " vs mx_matmul " + what);
      }

      if (out % mx::kMxBlock != 0) continue;
      std::vector<float> dy = mx_values(static_cast<size_t>(rows * out), ++seed, false);
      MxBuffers qdy(ElemType::kE4M3, {rows, out}), qwt(ElemType::kE4M3, {experts, in, out});
      oracle().mx_quantize(f32_view(dy, {rows, out}), mode, qdy.codes_view(), qdy.scales_view());
      oracle().mx_quantize_transposed(f32_view(w, {experts, out, in}), mode, qwt.codes_view(),
                                      qwt.scales_view());
      std::vector<float> dx(static_cast<size_t>(rows * in), 0.0f), dx_ref = dx;
      backend().mx_grouped_gemm_backward_input(qdy.operand(), qwt.operand(), offsets_view(offsets),
                                               f32_view(dx, {rows, in}));
      oracle().mx_grouped_gemm_backward_input(qdy.operand(), qwt.operand(), offsets_view(offsets),
                                              f32_view(dx_ref, {rows, in}));
      expect_gemm_matches(backend(), dx, dx_ref, out, "mx_grouped_gemm_backward_input " + what);
    }
}

// Bad input is a one-line error naming the op: a quantised dimension that is not a multiple of
// 32, codes or scales of the wrong dtype, operands that do not fit together.
TEST_P(MxKernelOps, RejectsBadInputNamingTheOp) {
  MOECORE_SKIP_UNLESS_IMPLEMENTED(backend().mx_quantize, backend().mx_quantize_transposed,
                                  backend().mx_dequantize, backend().mx_matmul,
                                  backend().mx_grouped_gemm_forward);
  std::vector<float> x(64 * 64);
  MxBuffers q(ElemType::kE4M3, {64, 32});
  std::vector<uint8_t> codes(48 * 64), scales(64 * 2);
  const TensorView codes_48(codes.data(), {2, 48}, DType::kE4m3);
  const TensorView scales_1(scales.data(), {2, 1}, DType::kE8m0);
  expect_error(
      [&] {
        backend().mx_quantize(view(x.data(), {2, 48}), ScaleMode::kRceil, codes_48, scales_1);
      },
      "[mx_quantize] contraction dimension k=48 is not a positive multiple of the MX "
      "block size 32");
  expect_error(
      [&] {
        backend().mx_quantize_transposed(view(x.data(), {48, 2}), ScaleMode::kRceil, codes_48,
                                         scales_1);
      },
      "[mx_quantize_transposed] contraction dimension k=48");
  expect_error(
      [&] {
        backend().mx_matmul({codes_48, scales_1}, {codes_48, scales_1}, 1.0f, 0.0f,
                            view(x.data(), {2, 2}));
      },
      "[mx_matmul] contraction dimension k=48");
  const std::vector<int64_t> offsets = {0, 2};
  expect_error(
      [&] {
        backend().mx_grouped_gemm_forward({codes_48, scales_1},
                                          {ConstTensorView(codes.data(), {1, 2, 48}, DType::kE4m3),
                                           ConstTensorView(scales.data(), {1, 2, 1}, DType::kE8m0)},
                                          offsets_view(offsets), view(x.data(), {2, 2}));
      },
      "[mx_grouped_gemm_forward] contraction dimension k=48");
  // Wrong dtypes.
  expect_error(
      [&] {
        backend().mx_quantize(view(x.data(), {64, 32}), ScaleMode::kRceil,
                              TensorView(x.data(), {64, 32}, DType::kF32), q.scales_view());
      },
      "[mx_quantize] codes must hold e4m3 or e5m2 codes, got f32");
  expect_error(
      [&] {
        backend().mx_quantize(view(x.data(), {64, 32}), ScaleMode::kRceil, q.codes_view(),
                              TensorView(q.codes.data(), {64, 1}, DType::kE4m3));
      },
      "[mx_quantize] scales must be e8m0, got e4m3");
  expect_error(
      [&] {
        backend().mx_matmul({q.codes_view(), TensorView(q.scales.data(), {64, 1}, DType::kE4m3)},
                            q.operand(), 1.0f, 0.0f, view(x.data(), {64, 64}));
      },
      "[mx_matmul] scales must be e8m0, got e4m3");
  expect_error(
      [&] {
        backend().mx_dequantize({TensorView(x.data(), {64, 32}, DType::kF32), q.scales_view()},
                                view(x.data(), {64, 32}));
      },
      "[mx_dequantize] codes must hold e4m3 or e5m2 codes, got f32");
  // Operands that disagree: K of a and b, the output's shape, the offsets.
  MxBuffers wide(ElemType::kE4M3, {64, 64});
  expect_error(
      [&] {
        backend().mx_matmul(q.operand(), wide.operand(), 1.0f, 0.0f, view(x.data(), {64, 64}));
      },
      "[mx_matmul] a [64, 32] and b [64, 64] contract over different extents");
  const std::vector<int64_t> decreasing = {0, 40, 30};  // the 64 rows of q, misnumbered
  MxBuffers w(ElemType::kE4M3, {2, 4, 32});
  expect_error(
      [&] {
        backend().mx_grouped_gemm_forward(q.operand(), w.operand(), offsets_view(decreasing),
                                          view(x.data(), {64, 4}));
      },
      "[mx_grouped_gemm_forward] expert_offsets decrease at expert 1");
}

INSTANTIATE_TEST_SUITE_P(Backends, MxKernelOps,
                         ::testing::ValuesIn(kernel_harness::registered_backends()), backend_name);

}  // namespace
}  // namespace moecore
