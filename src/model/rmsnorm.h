// RMSNorm as Hugging Face computes it: y = x * rsqrt(mean(x^2) + eps) * w, statistics in fp32.
// Rows are independent; the per-head QK-norm of Qwen3 is the same function with rows = tokens*heads
// and dim = head_dim. Gradient rules: see grad_rules.h.
#pragma once

#include <cstdint>

namespace moecore {

// x, y: [rows, dim]; w: [dim]; rstd: [rows] saved for the backward.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                     int64_t dim, float eps);

// dy, x: [rows, dim]; dx: [rows, dim] (=, or += when accumulate_dx); dw: [dim] (+=).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t rows, int64_t dim, bool accumulate_dx);

}  // namespace moecore
