#include "model/linear.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/device_memory.h"
#include "kernels/ops.h"

namespace moecore {

namespace {

// The MX operands of one call: codes and scales (and a zero-padded fp32 copy for the
// token-dimension quantisations), per calling thread, capacity kept across calls, on the device
// of the operands.
struct MxScratch {
  DeviceArray<uint8_t> codes[2], scales[2];
  DeviceArray<float> padded;
};

// The calling thread's scratch, on `device` (it moves when the operands do).
MxScratch& scratch(Device device) {
  thread_local MxScratch s;
  for (int slot : {0, 1}) {
    s.codes[slot].place_on(device);
    s.scales[slot].place_on(device);
  }
  s.padded.place_on(device);
  return s;
}

// x [rows, cols] along cols into slot `slot` of the scratch.
MxOperandView quantize_rows(const float* x, int64_t rows, int64_t cols, mx::ScaleMode mode,
                            int slot) {
  MxScratch& s = scratch(device_of(x));
  s.codes[slot].resize(static_cast<size_t>(rows * cols));
  s.scales[slot].resize(static_cast<size_t>(rows * cols / mx::kMxBlock));
  return mx_quantize_rows(x, rows, cols, mode, s.codes[slot].span(), s.scales[slot].span());
}

// x [rows, cols] along rows (the tokens), rows zero-padded to a multiple of 32: [cols, padded].
MxOperandView quantize_along_tokens(const float* x, int64_t rows, int64_t cols, mx::ScaleMode mode,
                                    int slot) {
  MxScratch& s = scratch(device_of(x));
  const int64_t padded = (rows + mx::kMxBlock - 1) / mx::kMxBlock * mx::kMxBlock;
  s.padded.resize(static_cast<size_t>(padded * cols));
  copy_bytes(s.padded.data(), x, static_cast<size_t>(rows * cols) * sizeof(float));
  zero_bytes(s.padded.data() + rows * cols,
             static_cast<size_t>((padded - rows) * cols) * sizeof(float));
  s.codes[slot].resize(static_cast<size_t>(padded * cols));
  s.scales[slot].resize(static_cast<size_t>(padded * cols / mx::kMxBlock));
  const TensorView codes(s.codes[slot].data(), {cols, padded}, DType::kE4m3);
  const TensorView scales(s.scales[slot].data(), {cols, padded / mx::kMxBlock}, DType::kE8m0);
  kernels::mx_quantize_transposed(view(s.padded.data(), {padded, cols}), mode, codes, scales);
  return {codes, scales};
}

// A weight cache [1, r, c] as the matrix [r, c] mx_matmul takes.
MxOperandView matrix(const MxOperandView& cache) {
  const ConstTensorView& c = cache.codes;
  const ConstTensorView& s = cache.scales;
  return {ConstTensorView(c.raw(), {c.size(1), c.size(2)}, c.dtype()),
          ConstTensorView(s.raw(), {s.size(1), s.size(2)}, s.dtype())};
}

}  // namespace

MxOperandView mx_quantize_rows(const float* x, int64_t rows, int64_t cols, mx::ScaleMode mode,
                               std::span<uint8_t> codes, std::span<uint8_t> scales) {
  const TensorView c(codes.data(), {rows, cols}, DType::kE4m3);
  const TensorView s(scales.data(), {rows, cols / mx::kMxBlock}, DType::kE8m0);
  kernels::mx_quantize(view(x, {rows, cols}), mode, c, s);
  return {c, s};
}

void mx_weight_grad(const float* dy, const float* x, float* dw, int64_t rows, int64_t in,
                    int64_t out, mx::ScaleMode mode) {
  if (rows == 0) return;
  const MxOperandView dy_t = quantize_along_tokens(dy, rows, out, mode, 0);
  const MxOperandView x_t = quantize_along_tokens(x, rows, in, mode, 1);
  kernels::mx_matmul(dy_t, x_t, 1.0f, 1.0f, view(dw, {out, in}));
}

ConstTensorView round_once(const float* x, int64_t rows, int64_t cols, Bf16Slot slot) {
  thread_local DeviceArray<uint16_t> copies[2];
  DeviceArray<uint16_t>& copy = copies[static_cast<int>(slot)];
  copy.place_on(device_of(x));
  copy.resize_for_overwrite(static_cast<size_t>(rows * cols));
  const TensorView rounded(copy.data(), {rows, cols}, DType::kBf16);
  if (rows * cols > 0) kernels::to_bf16(view(x, {rows, cols}), rounded);
  return rounded;
}

namespace {

// Whether bf16 GEMMs over the operand at x gain from reading one rounding of it: on a GPU, whose
// GEMMs multiply bf16 bits, and on the CPU where its GEMMs do (kernels::gemms_read_bf16_bits).
bool rounding_once_pays(kernels::MatmulPrecision precision, const float* x, int64_t elements) {
  if (precision != kernels::MatmulPrecision::kBf16 || elements == 0) return false;
  return device_of(x) != Device::kCpu || kernels::gemms_read_bf16_bits(precision);
}

// x as the matmul operand [rows, cols]: its rounding when it has one.
ConstTensorView operand(const LinearInput& x, int64_t rows, int64_t cols) {
  return x.bf16.raw() != nullptr ? x.bf16 : view(x.values, {rows, cols});
}

}  // namespace

LinearInput shared_linear_input(kernels::MatmulPrecision precision, const LinearWeight& w,
                                const float* x, int64_t rows, int64_t cols) {
  if (w.mx != nullptr || !rounding_once_pays(precision, x, rows * cols)) return {x};
  return {x, round_once(x, rows, cols, Bf16Slot::kLayerInput)};
}

void linear_forward(kernels::MatmulPrecision precision, const LinearInput& x, const LinearWeight& w,
                    float* y, int64_t rows, int64_t in, int64_t out) {
  if (w.mx == nullptr) {
    kernels::matmul(operand(x, rows, in), false, w.values, true, 1.0f, 0.0f, view(y, {rows, out}),
                    precision);
    return;
  }
  if (rows == 0) return;
  MOE_CHECK(x.values != nullptr, "[linear] an MXFP8 linear quantises fp32 x; bf16 bits were given");
  const MxOperandView xq = quantize_rows(x.values, rows, in, w.mx->scale_mode, 0);
  kernels::mx_matmul(xq, matrix(w.mx->along_in), 1.0f, 0.0f, view(y, {rows, out}));
}

void linear_backward(kernels::MatmulPrecision precision, const LinearInput& dy,
                     const LinearInput& x, const LinearWeight& w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (w.mx == nullptr) {
    // dy is read by both GEMMs: rounded once for them, unless it comes rounded. (The slot keeps
    // the largest dy it has held: the unchunked LM head's logits gradient, in bf16, the size of
    // the conversion that each of its GEMMs made before.)
    const bool round_dy = dy.bf16.raw() == nullptr && dx != nullptr &&
                          rounding_once_pays(precision, dy.values, rows * out);
    const ConstTensorView dy_operand =
        round_dy ? round_once(dy.values, rows, out, Bf16Slot::kOutputGrad) : operand(dy, rows, out);
    if (dx != nullptr)
      kernels::matmul(dy_operand, false, w.values, false, 1.0f, accumulate_dx ? 1.0f : 0.0f,
                      view(dx, {rows, in}), precision);
    kernels::matmul(dy_operand, true, operand(x, rows, in), false, 1.0f, 1.0f, view(dw, {out, in}),
                    precision);
    return;
  }
  if (rows == 0) return;
  MOE_CHECK(dy.values != nullptr && x.values != nullptr,
            "[linear] an MXFP8 linear's backward quantises fp32 dy and x; bf16 bits were given");
  const mx::ScaleMode mode = w.mx->scale_mode;
  if (dx != nullptr) {
    const MxOperandView dyq = quantize_rows(dy.values, rows, out, mode, 0);
    kernels::mx_matmul(dyq, matrix(w.mx->along_out), 1.0f, accumulate_dx ? 1.0f : 0.0f,
                       view(dx, {rows, in}));
  }
  if (w.mx->mx_weight_grad) {
    mx_weight_grad(dy.values, x.values, dw, rows, in, out, mode);
    return;
  }
  // OLMo-core's MXFP8 shared experts: grouped_mm in bf16 on the bf16 output gradient and the bf16
  // input it saved (no MX copy of it); the module's precision, whose GEMMs round both.
  kernels::matmul(view(dy.values, {rows, out}), true, view(x.values, {rows, in}), false, 1.0f, 1.0f,
                  view(dw, {out, in}), precision);
}

}  // namespace moecore
