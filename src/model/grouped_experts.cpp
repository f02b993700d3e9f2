#include "model/grouped_experts.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/ops.h"

namespace moecore {

namespace {

constexpr int64_t kBlock = mx::kMxBlock;

// Both of an MX layer's weight caches, or an error: a recipe that says MXFP8 never falls back.
const MxWeight& mx_weight(const MxWeight* weight, const char* name) {
  MOE_CHECK(weight != nullptr,
            "[moe] the recipe multiplies the experts in MXFP8 but {} has no MX cache", name);
  return *weight;
}

// x [rows, cols] quantised along cols (E4M3) into codes and scales, sized here.
MxOperandView quantize_rows(const float* x, int64_t rows, int64_t cols, mx::ScaleMode mode,
                            std::span<uint8_t> codes, std::span<uint8_t> scales) {
  const TensorView c(codes.data(), {rows, cols}, DType::kE4m3);
  const TensorView s(scales.data(), {rows, cols / kBlock}, DType::kE8m0);
  kernels::mx_quantize(view(x, {rows, cols}), mode, c, s);
  return {c, s};
}

MxOperandView saved_operand(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                            int64_t rows, int64_t cols) {
  return {ConstTensorView(codes.data(), {rows, cols}, DType::kE4m3),
          ConstTensorView(scales.data(), {rows, cols / kBlock}, DType::kE8m0)};
}

// dw[e] (+=) = dy_e^T . x_e for every local expert e, dy: [R, out], x: [R, in], dw: [E, out, in].
// bf16 (OLMo-core's recipe): x is the forward's MX copy dequantised; mx: both quantised along the
// tokens from fp32, each expert's rows zero-padded to a multiple of 32.
void expert_weight_grads(const PrecisionRecipe& precision, std::span<const int64_t> offsets,
                         const float* dy, int64_t out, const float* x_fp32,
                         const MxOperandView& x_saved, int64_t in, float* dw,
                         Workspace& workspace) {
  const int64_t local = static_cast<int64_t>(offsets.size()) - 1;
  Workspace::Scope scratch(workspace);
  if (!precision.mx.expert_wgrad) {
    // One expert's rows dequantised at a time, into a buffer of the calling thread that keeps its
    // capacity (grown to twice what it lacked): the busiest expert changes from step to step, and
    // a workspace scope of its size would grow the workspace at every new maximum (tests/alloc).
    thread_local std::vector<float> x;
    const auto* codes = static_cast<const uint8_t*>(x_saved.codes.raw());
    const auto* scales = static_cast<const uint8_t*>(x_saved.scales.raw());
    for (int64_t e = 0; e < local; ++e) {
      const int64_t begin = offsets[static_cast<size_t>(e)];
      const int64_t n = offsets[static_cast<size_t>(e + 1)] - begin;
      if (n == 0) continue;
      const auto values = static_cast<size_t>(n * in);
      if (x.capacity() < values) x.reserve(2 * values);
      x.resize(values);
      kernels::mx_dequantize(
          {ConstTensorView(codes + begin * in, {n, in}, x_saved.codes.dtype()),
           ConstTensorView(scales + begin * in / kBlock, {n, in / kBlock}, DType::kE8m0)},
          view(x.data(), {n, in}));
      kernels::matmul(view(dy + begin * out, {n, out}), true, view(x.data(), {n, in}), false, 1.0f,
                      1.0f, view(dw + e * out * in, {out, in}), precision.experts);
    }
    return;
  }
  int64_t most = 0;
  for (int64_t e = 0; e < local; ++e)
    most = std::max(most, offsets[static_cast<size_t>(e + 1)] - offsets[static_cast<size_t>(e)]);
  const int64_t padded_most = (most + kBlock - 1) / kBlock * kBlock;
  const std::span<float> dy_pad = scratch.uninitialized<float>(padded_most * out);
  const std::span<float> x_pad = scratch.uninitialized<float>(padded_most * in);
  const std::span<uint8_t> dy_codes = scratch.uninitialized<uint8_t>(padded_most * out);
  const std::span<uint8_t> dy_scales = scratch.uninitialized<uint8_t>(padded_most * out / kBlock);
  const std::span<uint8_t> x_codes = scratch.uninitialized<uint8_t>(padded_most * in);
  const std::span<uint8_t> x_scales = scratch.uninitialized<uint8_t>(padded_most * in / kBlock);
  for (int64_t e = 0; e < local; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t n = offsets[static_cast<size_t>(e + 1)] - begin;
    if (n == 0) continue;
    const int64_t padded = (n + kBlock - 1) / kBlock * kBlock;
    std::copy(dy + begin * out, dy + (begin + n) * out, dy_pad.begin());
    std::fill(dy_pad.begin() + n * out, dy_pad.begin() + padded * out, 0.0f);
    std::copy(x_fp32 + begin * in, x_fp32 + (begin + n) * in, x_pad.begin());
    std::fill(x_pad.begin() + n * in, x_pad.begin() + padded * in, 0.0f);
    const TensorView dy_t(dy_codes.data(), {out, padded}, DType::kE4m3);
    const TensorView dy_t_scales(dy_scales.data(), {out, padded / kBlock}, DType::kE8m0);
    const TensorView x_t(x_codes.data(), {in, padded}, DType::kE4m3);
    const TensorView x_t_scales(x_scales.data(), {in, padded / kBlock}, DType::kE8m0);
    kernels::mx_quantize_transposed(view(dy_pad.data(), {padded, out}), precision.mx.scale_mode,
                                    dy_t, dy_t_scales);
    kernels::mx_quantize_transposed(view(x_pad.data(), {padded, in}), precision.mx.scale_mode, x_t,
                                    x_t_scales);
    kernels::mx_matmul({dy_t, dy_t_scales}, {x_t, x_t_scales}, 1.0f, 1.0f,
                       view(dw + e * out * in, {out, in}));
  }
}

void mx_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                const MoeWeights& w, ExpertRows& rows, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  const mx::ScaleMode mode = precision.mx.scale_mode;
  if (received == 0) return;
  rows.x_codes.resize(static_cast<size_t>(received * d));
  rows.x_scales.resize(static_cast<size_t>(received * d / kBlock));
  rows.act_codes.resize(static_cast<size_t>(received * h));
  rows.act_scales.resize(static_cast<size_t>(received * h / kBlock));
  const TensorView gu = view(rows.gu.data(), {received, 2 * h});
  const MxOperandView x =
      quantize_rows(rows.x.data(), received, d, mode, rows.x_codes, rows.x_scales);
  kernels::mx_grouped_gemm_forward(x, mx_weight(w.experts_gate_up_mx, "experts' gate_up").along_in,
                                   offsets, gu);
  kernels::swiglu_forward(gu, view(rows.act.data(), {received, h}));
  const MxOperandView act =
      quantize_rows(rows.act.data(), received, h, mode, rows.act_codes, rows.act_scales);
  kernels::mx_grouped_gemm_forward(act, mx_weight(w.experts_down_mx, "experts' down").along_in,
                                   offsets, view(y, {received, d}));
}

void mx_backward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                 const MoeWeights& w, const MoeGrads& dw, const ExpertRows& rows, const float* dy,
                 float* dx, Workspace& workspace) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  const mx::ScaleMode mode = precision.mx.scale_mode;
  const MxWeight& gate_up = mx_weight(w.experts_gate_up_mx, "experts' gate_up");
  const MxWeight& down = mx_weight(w.experts_down_mx, "experts' down");
  if (received == 0) return;
  Workspace::Scope scratch(workspace);
  const std::span<float> dact = scratch.uninitialized<float>(received * h);
  const std::span<float> dgu = scratch.uninitialized<float>(received * 2 * h);
  // The output gradients' codes: dy [R, d], then dgu [R, 2H].
  const int64_t widest = std::max(d, 2 * h);
  const std::span<uint8_t> codes = scratch.uninitialized<uint8_t>(received * widest);
  const std::span<uint8_t> scales = scratch.uninitialized<uint8_t>(received * widest / kBlock);

  const MxOperandView dy_q = quantize_rows(dy, received, d, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dy_q, down.along_out, offsets,
                                          view(dact.data(), {received, h}));
  expert_weight_grads(precision, offsets, dy, d, rows.act.data(),
                      saved_operand(rows.act_codes, rows.act_scales, received, h), h,
                      dw.experts_down, workspace);
  kernels::swiglu_backward(view(dact.data(), {received, h}),
                           view(rows.gu.data(), {received, 2 * h}),
                           view(dgu.data(), {received, 2 * h}));
  const MxOperandView dgu_q = quantize_rows(dgu.data(), received, 2 * h, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dgu_q, gate_up.along_out, offsets,
                                          view(dx, {received, d}));
  expert_weight_grads(precision, offsets, dgu.data(), 2 * h, rows.x.data(),
                      saved_operand(rows.x_codes, rows.x_scales, received, d), d,
                      dw.experts_gate_up, workspace);
}

}  // namespace

// Every expert's SwiGLU MLP as two grouped GEMMs around one SwiGLU over all rows: the same per-row
// arithmetic as one MLP per expert (the SwiGLU is elementwise; the grouped GEMM calls the same
// GEMM per expert, with the same threading; kernels/cpu/grouped_gemm.cpp).
void grouped_experts_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                             const MoeWeights& w, ExpertRows& rows, float* y) {
  if (precision.mx.experts) return mx_forward(precision, c, local, w, rows, y);
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  const ConstTensorView gate_up = w.experts_gate_up;  // [local, 2H, d]
  const ConstTensorView down = w.experts_down;        // [local, d, H]
  const TensorView gu = view(rows.gu.data(), {received, 2 * h});
  const TensorView act = view(rows.act.data(), {received, h});
  kernels::grouped_gemm_forward(view(rows.x.data(), {received, d}), gate_up, offsets, gu,
                                precision.experts);
  kernels::swiglu_forward(gu, act);
  kernels::grouped_gemm_forward(act, down, offsets, view(y, {received, d}), precision.experts);
}

void grouped_experts_backward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                              const MoeWeights& w, const MoeGrads& dw, const ExpertRows& rows,
                              const float* dy, float* dx, Workspace& workspace) {
  if (precision.mx.experts) return mx_backward(precision, c, local, w, dw, rows, dy, dx, workspace);
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  Workspace::Scope scratch(workspace);
  const std::span<float> dact = scratch.zeroed<float>(received * h);
  const std::span<float> dgu = scratch.zeroed<float>(received * 2 * h);
  const ConstTensorView gu = view(rows.gu.data(), {received, 2 * h});
  kernels::grouped_gemm_backward(view(dy, {received, d}), view(rows.act.data(), {received, h}),
                                 w.experts_down, offsets, view(dact.data(), {received, h}),
                                 view(dw.experts_down, {local, d, h}), precision.experts);
  kernels::swiglu_backward(view(dact.data(), {received, h}), gu,
                           view(dgu.data(), {received, 2 * h}));
  kernels::grouped_gemm_backward(view(dgu.data(), {received, 2 * h}),
                                 view(rows.x.data(), {received, d}), w.experts_gate_up, offsets,
                                 view(dx, {received, d}),
                                 view(dw.experts_gate_up, {local, 2 * h, d}), precision.experts);
}

}  // namespace moecore
