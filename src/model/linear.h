// Bias-free linear layer in PyTorch layout: y[N, out] = x[N, in] * W[out, in]^T.
#pragma once

#include <cstdint>

namespace moecore {

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out);

// dx[N, in] = dy * W (=, or += when accumulate_dx); dW[out, in] += dy^T * x.
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace moecore
