#include "model/grouped_experts.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/ops.h"
#include "model/linear.h"

namespace moecore {

namespace {

constexpr int64_t kBlock = mx::kMxBlock;

// Both of an MX layer's weight caches, or an error: a recipe that says MXFP8 never falls back.
const MxWeight& mx_weight(const MxWeight* weight, const char* name) {
  MOE_CHECK(weight != nullptr,
            "[moe] the recipe multiplies the experts in MXFP8 but {} has no MX cache", name);
  return *weight;
}

MxOperandView saved_operand(const DeviceArray<uint8_t>& codes, const DeviceArray<uint8_t>& scales,
                            int64_t rows, int64_t cols) {
  return {ConstTensorView(codes.data(), {rows, cols}, DType::kE4m3),
          ConstTensorView(scales.data(), {rows, cols / kBlock}, DType::kE8m0)};
}

// dw[e] (+=) = dy_e^T . x_e for every local expert e, dy: [R, out], x: [R, in], dw: [E, out, in].
// bf16 (OLMo-core's recipe): x is the forward's MX copy dequantised; mx: both quantised along the
// tokens from fp32, each expert's rows zero-padded to a multiple of 32 (model/linear.h).
void expert_weight_grads(const PrecisionRecipe& precision, std::span<const int64_t> offsets,
                         const float* dy, int64_t out, const float* x_fp32,
                         const MxOperandView& x_saved, int64_t in, float* dw) {
  const int64_t local = static_cast<int64_t>(offsets.size()) - 1;
  // One expert's rows dequantised at a time, into a buffer of the calling thread that keeps its
  // capacity (grown to twice what it lacked): the busiest expert changes from step to step, and
  // a workspace scope of its size would grow the workspace at every new maximum (tests/alloc).
  // It lives where the operands do (a thread's scratch moves when they move).
  thread_local DeviceArray<float> x;
  x.place_on(device_of(dy));
  const auto* codes = static_cast<const uint8_t*>(x_saved.codes.raw());
  const auto* scales = static_cast<const uint8_t*>(x_saved.scales.raw());
  for (int64_t e = 0; e < local; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t n = offsets[static_cast<size_t>(e + 1)] - begin;
    if (n == 0) continue;
    float* dw_e = dw + e * out * in;
    if (precision.mx.expert_wgrad) {
      mx_weight_grad(dy + begin * out, x_fp32 + begin * in, dw_e, n, in, out,
                     precision.mx.scale_mode);
      continue;
    }
    const auto values = static_cast<size_t>(n * in);
    if (x.capacity() < values) x.reserve(2 * values);
    x.resize(values);
    kernels::mx_dequantize(
        {ConstTensorView(codes + begin * in, {n, in}, x_saved.codes.dtype()),
         ConstTensorView(scales + begin * in / kBlock, {n, in / kBlock}, DType::kE8m0)},
        view(x.data(), {n, in}));
    kernels::matmul(view(dy + begin * out, {n, out}), true, view(x.data(), {n, in}), false, 1.0f,
                    1.0f, view(dw_e, {out, in}), precision.experts);
  }
}

void mx_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                const MoeWeights& w, ExpertRows& rows, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
  const mx::ScaleMode mode = precision.mx.scale_mode;
  if (received == 0) return;
  rows.x_codes.resize(static_cast<size_t>(received * d));
  rows.x_scales.resize(static_cast<size_t>(received * d / kBlock));
  rows.act_codes.resize(static_cast<size_t>(received * h));
  rows.act_scales.resize(static_cast<size_t>(received * h / kBlock));
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
  const std::span<uint8_t> scales = scratch.uninitialized<uint8_t>(received * widest / kBlock);

  // The weight gradients run expert by expert from the host (each expert's rows dequantised, or
  // padded to a multiple of 32 for mx.expert_wgrad): they read the offsets there, the one wait
  // for the routing left in the MXFP8 experts.
  const std::vector<int64_t> host_offsets = host_copy(rows.expert_offsets);
  const MxOperandView dy_q = mx_quantize_rows(dy, received, d, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dy_q, down.along_out, offsets,
                                          view(dact.data(), {received, h}));
  expert_weight_grads(precision, host_offsets, dy, d, rows.act.data(),
                      saved_operand(rows.act_codes, rows.act_scales, received, h), h,
                      dw.experts_down);
  kernels::swiglu_backward(view(dact.data(), {received, h}),
                           view(rows.gu.data(), {received, 2 * h}),
                           view(dgu.data(), {received, 2 * h}));
  const MxOperandView dgu_q = mx_quantize_rows(dgu.data(), received, 2 * h, mode, codes, scales);
  kernels::mx_grouped_gemm_backward_input(dgu_q, gate_up.along_out, offsets,
                                          view(dx, {received, d}));
  expert_weight_grads(precision, host_offsets, dgu.data(), 2 * h, rows.x.data(),
                      saved_operand(rows.x_codes, rows.x_scales, received, d), d,
                      dw.experts_gate_up);
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
  const int64_t received = rows.received;
  const ConstTensorView offsets = view(rows.expert_offsets.data(), {local + 1});
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
