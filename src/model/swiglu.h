// SwiGLU activation over a fused gate/up projection: gu[rows, 2H] holds gate in columns [0, H)
// and up in [H, 2H); act[rows, H] = silu(gate) * up.
#pragma once

#include <cstdint>

namespace moecore {

void swiglu_forward(const float* gu, float* act, int64_t rows, int64_t hidden);

// dgu[rows, 2H] (=) from dact[rows, H].
void swiglu_backward(const float* dact, const float* gu, float* dgu, int64_t rows, int64_t hidden);

}  // namespace moecore
