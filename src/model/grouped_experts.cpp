#include "model/grouped_experts.h"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "core/check.h"
#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

namespace {

// Both of an MX layer's weight caches, or an error: a recipe that says MXFP8 never falls back.
const MxWeight& mx_weight(const MxWeight* weight, const char* name) {
  MOE_CHECK(weight != nullptr,
            "[moe] the recipe multiplies the experts in MXFP8 but {} has no MX cache", name);
  return *weight;
}

MxOperandView saved_operand(const DeviceArray<uint8_t>& codes, const DeviceArray<uint8_t>& scales,
                            int64_t rows, int64_t cols) {
  return {ConstTensorView(codes.data(), {rows, cols}, DType::kE4m3),
          ConstTensorView(scales.data(), {rows, cols / mx::kMxBlock}, DType::kE8m0)};
}

// dw (+=) [local, out, in]: dw[e] += dy_e^T . x_e for every local expert e, dy: [R, out], x: [R,
// in] (w: the experts' weight, [local, out, in], for its shape). OLMo-core's recipe: in bf16 on the
// forward's MX copy of x dequantised, all R rows at once (each row's blocks lie along `in`, so
// these are the values expert by expert) into `workspace`, straight to the bf16 bits the GEMM
// multiplies, and one grouped GEMM that reads the offsets where they are: the host does not wait
// for the routing (a CUDA graph can hold it).
// mx.expert_wgrad: both operands quantised along the tokens from fp32, each expert's rows
// zero-padded to a multiple of 32 (model/linear.h), expert by expert on the host's copy of the
// offsets (host_offsets).
void expert_weight_grads(const PrecisionRecipe& precision, ConstTensorView offsets,
                         std::span<const int64_t> host_offsets, ConstTensorView w, const float* dy,
                         int64_t out, const float* x_fp32, const MxOperandView& x_saved, int64_t in,
                         float* dw, Workspace& workspace) {
  const int64_t local = offsets.numel() - 1, received = x_saved.codes.size(0);
  if (!precision.mx.expert_wgrad) {
    Workspace::Scope scratch(workspace);
    const std::span<uint16_t> x = scratch.uninitialized<uint16_t>(received * in);
    const TensorView x16(x.data(), {received, in}, DType::kBf16);
    kernels::mx_dequantize(x_saved, x16);
    kernels::grouped_gemm_backward(view(dy, {received, out}), x16, w, offsets, TensorView(),
                                   view(dw, {local, out, in}), precision.experts);
    return;
  }
  for (int64_t e = 0; e < local; ++e) {
    const int64_t begin = host_offsets[static_cast<size_t>(e)];
    const int64_t n = host_offsets[static_cast<size_t>(e + 1)] - begin;
    if (n == 0) continue;
    mx_weight_grad(dy + begin * out, x_fp32 + begin * in, dw + e * out * in, n, in, out,
                   precision.mx.scale_mode);
  }
}

void mx_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                const MoeWeights& w, ExpertRows& rows, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
  const mx::ScaleMode mode = precision.mx.scale_mode;
  rows.gu.resize(static_cast<size_t>(received * 2 * h));
  rows.act.resize(static_cast<size_t>(received * h));
  if (received == 0) return;
  rows.x_codes.resize(static_cast<size_t>(received * d));
  rows.x_scales.resize(static_cast<size_t>(received * d / mx::kMxBlock));
  rows.act_codes.resize(static_cast<size_t>(received * h));
  rows.act_scales.resize(static_cast<size_t>(received * h / mx::kMxBlock));
  const TensorView gu = view(rows.gu.data(), {received, 2 * h});
  const MxOperandView x =
      mx_quantize_rows(rows.x.data(), received, d, mode, rows.x_codes.span(), rows.x_scales.span());
  kernels::mx_grouped_gemm_forward(x, mx_weight(w.experts_gate_up_mx, "experts' gate_up").along_in,
                                   offsets, gu);
  kernels::swiglu_forward(gu, view(rows.act.data(), {received, h}));
  const MxOperandView act = mx_quantize_rows(rows.act.data(), received, h, mode,
                                             rows.act_codes.span(), rows.act_scales.span());
  kernels::mx_grouped_gemm_forward(act, mx_weight(w.experts_down_mx, "experts' down").along_in,
                                   offsets, view(y, {received, d}));
}

void mx_backward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                 const MoeWeights& w, const MoeGrads& dw, const ExpertRows& rows, const float* dy,
                 float* dx, Workspace& workspace) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
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
  const std::span<uint8_t> scales =
      scratch.uninitialized<uint8_t>(received * widest / mx::kMxBlock);

  // mx.expert_wgrad's weight gradients run expert by expert from the host: they read the offsets
  // there, once per layer (OLMo-core's recipe reads nothing).
  const std::vector<int64_t> host_offsets =
      precision.mx.expert_wgrad ? host_copy(rows.expert_offsets) : std::vector<int64_t>();
  const MxOperandView dy_q = mx_quantize_rows(dy, received, d, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dy_q, down.along_out, offsets,
                                          view(dact.data(), {received, h}));
  expert_weight_grads(precision, offsets, host_offsets, w.experts_down, dy, d, rows.act.data(),
                      saved_operand(rows.act_codes, rows.act_scales, received, h), h,
                      dw.experts_down, workspace);
  kernels::swiglu_backward(view(dact.data(), {received, h}),
                           view(rows.gu.data(), {received, 2 * h}),
                           view(dgu.data(), {received, 2 * h}));
  const MxOperandView dgu_q = mx_quantize_rows(dgu.data(), received, 2 * h, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dgu_q, gate_up.along_out, offsets,
                                          view(dx, {received, d}));
  expert_weight_grads(precision, offsets, host_offsets, w.experts_gate_up, dgu.data(), 2 * h,
                      rows.x.data(), saved_operand(rows.x_codes, rows.x_scales, received, d), d,
                      dw.experts_gate_up, workspace);
}

ConstTensorView bf16_view(const DeviceArray<uint16_t>& bits, int64_t rows, int64_t cols) {
  return ConstTensorView(bits.data(), {rows, cols}, DType::kBf16);
}
TensorView bf16_view(DeviceArray<uint16_t>& bits, int64_t rows, int64_t cols) {
  return TensorView(bits.data(), {rows, cols}, DType::kBf16);
}

}  // namespace

// Every expert's SwiGLU MLP as two grouped GEMMs around one SwiGLU over all rows: the same per-row
// arithmetic as one MLP per expert (the SwiGLU is elementwise; the grouped GEMM calls the same
// GEMM per expert, with the same threading; kernels/cpu/grouped_gemm.cpp).
void grouped_experts_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                             const MoeWeights& w, ExpertRows& rows, float* y) {
  if (precision.mx.experts) return mx_forward(precision, c, local, w, rows, y);
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
  const ConstTensorView gate_up = w.experts_gate_up;  // [local, 2H, d]
  const ConstTensorView down = w.experts_down;        // [local, d, H]
  rows.gu.resize(static_cast<size_t>(received * 2 * h));
  const TensorView gu = view(rows.gu.data(), {received, 2 * h});
  // The operands the GEMMs read: x and the SwiGLU output as they are, or (kBf16) x rounded once
  // and the SwiGLU output written in bf16, both kept for the backward.
  ConstTensorView x = view(rows.x.data(), {received, d});
  TensorView act;
  if (kept_expert_inputs(precision) == KeptExpertInputs::kBf16) {
    rows.x_bf16.resize_for_overwrite(static_cast<size_t>(received * d));
    rows.act_bf16.resize_for_overwrite(static_cast<size_t>(received * h));
    const TensorView x16 = bf16_view(rows.x_bf16, received, d);
    kernels::to_bf16(x, x16);
    x = x16;
    act = bf16_view(rows.act_bf16, received, h);
  } else {
    rows.act.resize(static_cast<size_t>(received * h));
    act = view(rows.act.data(), {received, h});
  }
  kernels::grouped_gemm_forward(x, gate_up, offsets, gu, precision.experts);
  kernels::swiglu_forward(gu, act);
  kernels::grouped_gemm_forward(act, down, offsets, view(y, {received, d}), precision.experts);
}

void grouped_experts_backward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                              const MoeWeights& w, const MoeGrads& dw, const ExpertRows& rows,
                              const float* dy, float* dx, Workspace& workspace) {
  if (precision.mx.experts) return mx_backward(precision, c, local, w, dw, rows, dy, dx, workspace);
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
  const bool bf16 = kept_expert_inputs(precision) == KeptExpertInputs::kBf16;
  Workspace::Scope scratch(workspace);
  const std::span<float> dact = scratch.zeroed<float>(received * h);
  const ConstTensorView gu = view(rows.gu.data(), {received, 2 * h});
  const ConstTensorView act =
      bf16 ? bf16_view(rows.act_bf16, received, h) : view(rows.act.data(), {received, h});
  const ConstTensorView x =
      bf16 ? bf16_view(rows.x_bf16, received, d) : view(rows.x.data(), {received, d});
  kernels::grouped_gemm_backward(view(dy, {received, d}), act, w.experts_down, offsets,
                                 view(dact.data(), {received, h}),
                                 view(dw.experts_down, {local, d, h}), precision.experts);
  // The SwiGLU's gradient: in bf16 only the gate/up GEMMs read it. swiglu_backward writes every
  // row, so it needs no zeroing.
  const DType dgu_type = bf16 ? DType::kBf16 : DType::kF32;
  const std::span<std::byte> dgu_bytes = scratch.uninitialized<std::byte>(
      received * 2 * h * static_cast<int64_t>(dtype_size(dgu_type)));
  const TensorView dgu(dgu_bytes.data(), {received, 2 * h}, dgu_type);
  kernels::swiglu_backward(view(dact.data(), {received, h}), gu, dgu);
  kernels::grouped_gemm_backward(dgu, x, w.experts_gate_up, offsets, view(dx, {received, d}),
                                 view(dw.experts_gate_up, {local, 2 * h, d}), precision.experts);
}

}  // namespace moecore
