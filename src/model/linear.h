// Bias-free linear layer in PyTorch layout: y[N, out] = x[N, in] * W[out, in]^T.
// linear_forward/backward multiply in kernels::matmul_precision() (fp32 or bf16 operands, fp32
// accumulation and outputs); the _fp32 pair always multiplies in fp32, for layers whose outputs
// must not carry bf16 rounding (the router: its logits pick the experts).
#pragma once

#include <cstdint>

namespace moecore {

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out);

// dx[N, in] = dy * W (=, or += when accumulate_dx); dW[out, in] += dy^T * x.
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

void linear_forward_fp32(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                         int64_t out);
void linear_backward_fp32(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace moecore
