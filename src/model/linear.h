// Bias-free linear layer in PyTorch layout: y[N, out] = x[N, in] * W[out, in]^T, its GEMMs in the
// caller's module precision (fp32 or bf16 operands, fp32 accumulation and outputs; the module's
// entry of model/precision_recipe.h). W is the fp32 weight or, in a bf16 GEMM, its bf16 copy
// (model/bf16_weight_copies.h); its gradient is always fp32.
#pragma once

#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/matmul_precision.h"

namespace moecore {

void linear_forward(kernels::MatmulPrecision precision, const float* x, ConstTensorView w, float* y,
                    int64_t rows, int64_t in, int64_t out);

// dx[N, in] = dy * W (=, or += when accumulate_dx); dW[out, in] += dy^T * x.
void linear_backward(kernels::MatmulPrecision precision, const float* dy, const float* x,
                     ConstTensorView w, float* dx, float* dw, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx);

}  // namespace moecore
