// Bias-free linear layer in PyTorch layout: y[N, out] = x[N, in] * W[out, in]^T, its GEMMs in the
// caller's module precision (fp32 or bf16 operands, fp32 accumulation and outputs; the module's
// entry of model/precision_recipe.h). W is the fp32 weight or, in a bf16 GEMM, its bf16 copy
// (model/bf16_weight_copies.h); its gradient is always fp32.
//
// MXFP8 (train.mxfp8_dense, OLMo-core 3's MXFP8 linear): when the weight carries MX caches all
// three GEMMs are MX GEMMs: the forward x (quantised along `in`) . W^T (its cache along `in`); the
// input gradient dy (along `out`) . W (its cache along `out`); the weight gradient dy^T . x with
// both quantised along the tokens from fp32 (rows zero-padded to a multiple of 32: a zero adds
// nothing to a block's amax or its sum), re-quantised rather than byte-transposed. Their codes are
// temporaries in buffers of the calling thread that keep their capacity across calls.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor_view.h"
#include "kernels/matmul_precision.h"
#include "model/mx_weight_caches.h"

namespace moecore {

// A linear layer's weight as its GEMMs read it: `values` (fp32, or the bf16 copy), and its MX
// caches when the recipe runs the layer in MXFP8 (nullptr otherwise).
struct LinearWeight {
  LinearWeight() = default;
  LinearWeight(ConstTensorView w) : values(w) {}  // NOLINT: implicit, the plain case
  LinearWeight(TensorView w) : values(w) {}       // NOLINT: as a const view
  LinearWeight(ConstTensorView w, const MxWeight* mx_caches) : values(w), mx(mx_caches) {}
  ConstTensorView values;
  const MxWeight* mx = nullptr;
};

// x [rows, cols] quantised along cols (E4M3, `mode` scales) into codes [rows, cols] and scales
// [rows, cols / 32] the caller provides: an activation or output gradient as an MX GEMM operand.
MxOperandView mx_quantize_rows(const float* x, int64_t rows, int64_t cols, mx::ScaleMode mode,
                               std::span<uint8_t> codes, std::span<uint8_t> scales);

// dw[out, in] += dy^T . x as an MX GEMM, dy [rows, out] and x [rows, in] both quantised along the
// rows (the tokens) from fp32, zero-padded to a multiple of 32 rows: the weight gradient of an
// MXFP8 linear, and of an MXFP8 expert (its rows) under mxfp8_expert_wgrad.
void mx_weight_grad(const float* dy, const float* x, float* dw, int64_t rows, int64_t in,
                    int64_t out, mx::ScaleMode mode);

void linear_forward(kernels::MatmulPrecision precision, const float* x, const LinearWeight& w,
                    float* y, int64_t rows, int64_t in, int64_t out);

// dx[N, in] = dy * W (=, or += when accumulate_dx); dW[out, in] += dy^T * x.
void linear_backward(kernels::MatmulPrecision precision, const float* dy, const float* x,
                     const LinearWeight& w, float* dx, float* dw, int64_t rows, int64_t in,
                     int64_t out, bool accumulate_dx);

}  // namespace moecore
