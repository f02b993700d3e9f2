// The routed experts of one rank as a grouped GEMM: one SwiGLU MLP per local expert over its
// contiguous rows of expert-major buffers. Every dispatch strategy ends here.
//
// In bf16 the experts' activations that only GEMMs read are kept in bf16 (KeptExpertInputs::kBf16):
// x rounded once for the forward's GEMM and the backward's weight gradient, the SwiGLU output
// written in bf16 by the SwiGLU itself, and the SwiGLU's gradient likewise. Each is the rounding
// every one of those GEMMs would make of the fp32 value, so the products are the same to the bit,
// with one rounding pass (or none) instead of one per GEMM, and half the bytes kept.
//
// In MXFP8 (PrecisionRecipe::mx.experts, OLMo-core 3's recipe) the forward and input-gradient
// GEMMs run on MX operands: the inputs and output gradients quantised along the contraction
// dimension here, the weights from their once-per-step caches (MoeWeights::*_mx). The forward
// keeps its quantised inputs (x and the SwiGLU output) for the backward, whose weight-gradient
// GEMM multiplies them dequantised, in bf16; with mx.expert_wgrad it is an MX GEMM too, on the
// fp32 inputs and output gradients quantised along the tokens (each expert's rows padded with
// zeros to a multiple of 32: a zero adds nothing to a block's amax or its sum).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "core/workspace.h"
#include "model/config.h"
#include "model/moe_dispatch.h"
#include "model/precision_recipe.h"

namespace moecore {

// The expert-major rows of one forward, kept for the backward.
struct ExpertRows {
  // R, the rows of this rank's local experts: what the host sizes the buffers by, known without
  // reading the routing (tokens * k for the local dispatch; the exchange's counts under EP).
  int64_t received = 0;
  // [E_local + 1] the row range of each local expert, where the model's tensors are: the grouped
  // GEMMs read them there, so the local dispatch never waits for the routing on the host (on a
  // GPU: no synchronisation between the router and the experts).
  DeviceArray<int64_t> expert_offsets;
  // received and expert_offsets from offsets planned on the host (the expert-parallel dispatches).
  void set_offsets(const std::vector<int64_t>& offsets) {
    received = offsets.back();
    expert_offsets.resize_for_overwrite(offsets.size());
    copy_bytes(expert_offsets.data(), offsets.data(), offsets.size() * sizeof(int64_t));
  }
  // [R, d] expert inputs, written by the dispatch. Under KeptExpertInputs kBf16 and kMx the
  // forward alone reads them (MoeBlock lends the buffer for it).
  DeviceArray<float> x;
  DeviceArray<float> gu;   // [R, 2H], what the experts' forward writes from here on
  DeviceArray<float> act;  // [R, H] (not under kBf16)
  // kBf16: x and act as bf16 bits, the forward's GEMM operands and the backward's.
  DeviceArray<uint16_t> x_bf16, act_bf16;  // [R, d], [R, H]
  // MXFP8 only: x and act quantised along their last dimension (E4M3 codes, E8M0 scales), the
  // forward GEMMs' operands. The backward reads these instead of x and act unless
  // mx.expert_wgrad (MoeBlock then lends x and act only for the forward).
  DeviceArray<uint8_t> x_codes, x_scales;      // [R, d], [R, d / 32]
  DeviceArray<uint8_t> act_codes, act_scales;  // [R, H], [R, H / 32]
};

// y: [R, d] (=) from rows.x; sizes and writes the rest of `rows`. Experts without rows are skipped.
void grouped_experts_forward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                             const MoeWeights& w, ExpertRows& rows, float* y);

// dy: [R, d] -> dx: [R, d] (=); expert weight gradients += into dw. Experts write disjoint rows of
// dx and disjoint weight gradients. The SwiGLU's gradients (and in MXFP8 the quantised output
// gradients and dequantised inputs) are temporaries from `workspace`.
void grouped_experts_backward(const PrecisionRecipe& precision, const ModelConfig& c, int64_t local,
                              const MoeWeights& w, const MoeGrads& dw, const ExpertRows& rows,
                              const float* dy, float* dx, Workspace& workspace);

}  // namespace moecore
