#include "model/grouped_experts.h"

#include "kernels/ops.h"

namespace moecore {

// Every expert's SwiGLU MLP as two grouped GEMMs around one SwiGLU over all rows: the same per-row
// arithmetic as one MLP per expert (the SwiGLU is elementwise; the grouped GEMM calls the same
// GEMM per expert, with the same threading; kernels/cpu/grouped_gemm.cpp).
void grouped_experts_forward(kernels::MatmulPrecision precision, const ModelConfig& c,
                             int64_t local, const MoeWeights& w, ExpertRows& rows, float* y) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  const ConstTensorView gate_up = w.experts_gate_up;  // [local, 2H, d]
  const ConstTensorView down = w.experts_down;        // [local, d, H]
  const TensorView gu = view(rows.gu.data(), {received, 2 * h});
  const TensorView act = view(rows.act.data(), {received, h});
  kernels::grouped_gemm_forward(view(rows.x.data(), {received, d}), gate_up, offsets, gu,
                                precision);
  kernels::swiglu_forward(gu, act);
  kernels::grouped_gemm_forward(act, down, offsets, view(y, {received, d}), precision);
}

void grouped_experts_backward(kernels::MatmulPrecision precision, const ModelConfig& c,
                              int64_t local, const MoeWeights& w, const MoeGrads& dw,
                              const ExpertRows& rows, const float* dy, float* dx,
                              Workspace& workspace) {
  const int64_t d = c.hidden_size, h = c.moe_intermediate_size;
  const int64_t received = rows.expert_offsets[static_cast<size_t>(local)];
  const std::span<const int64_t> offsets(rows.expert_offsets);
  Workspace::Scope scratch(workspace);
  const std::span<float> dact = scratch.zeroed<float>(received * h);
  const std::span<float> dgu = scratch.zeroed<float>(received * 2 * h);
  const ConstTensorView gu = view(rows.gu.data(), {received, 2 * h});
  kernels::grouped_gemm_backward(view(dy, {received, d}), view(rows.act.data(), {received, h}),
                                 w.experts_down, offsets, view(dact.data(), {received, h}),
                                 view(dw.experts_down, {local, d, h}), precision);
  kernels::swiglu_backward(view(dact.data(), {received, h}), gu,
                           view(dgu.data(), {received, 2 * h}));
  kernels::grouped_gemm_backward(
      view(dgu.data(), {received, 2 * h}), view(rows.x.data(), {received, d}), w.experts_gate_up,
      offsets, view(dx, {received, d}), view(dw.experts_gate_up, {local, 2 * h, d}), precision);
}

}  // namespace moecore
