// The routed experts of one rank as a grouped GEMM: one SwiGLU MLP per local expert over its
// contiguous rows of expert-major buffers. Every dispatch strategy ends here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/workspace.h"
#include "kernels/matmul_precision.h"
#include "model/config.h"
#include "model/moe_dispatch.h"

namespace moecore {

// The expert-major rows of one forward, kept for the backward.
struct ExpertRows {
  std::vector<int64_t> expert_offsets;  // [E_local + 1] row range of each local expert
  std::vector<float> x;                 // [R, d] expert inputs
  std::vector<float> gu;                // [R, 2H]
  std::vector<float> act;               // [R, H]
};

// y: [R, d] (=). Experts without rows are skipped.
void grouped_experts_forward(kernels::MatmulPrecision precision, const ModelConfig& c,
                             int64_t local, const MoeWeights& w, ExpertRows& rows, float* y);

// dy: [R, d] -> dx: [R, d] (=); expert weight gradients += into dw. Experts write disjoint rows of
// dx and disjoint weight gradients. The SwiGLU's gradients are temporaries from `workspace`.
void grouped_experts_backward(kernels::MatmulPrecision precision, const ModelConfig& c,
                              int64_t local, const MoeWeights& w, const MoeGrads& dw,
                              const ExpertRows& rows, const float* dy, float* dx,
                              Workspace& workspace);

}  // namespace moecore
