// Bias-free linear layer in PyTorch layout: y[N, out] = x[N, in] * W[out, in]^T, its GEMMs in the
// caller's module precision (fp32 or bf16 operands, fp32 accumulation and outputs; the module's
// entry of model/precision_recipe.h). W is the fp32 weight or, in a bf16 GEMM, its bf16 copy
// (model/bf16_weight_copies.h); its gradient is always fp32.
//
// MXFP8: when the weight carries MX caches the forward x (quantised along `in`) . W^T (its cache
// along `in`) and the input gradient dy (along `out`) . W (its cache along `out`) are MX GEMMs.
// The weight gradient dy^T . x is one too where MxWeight::mx_weight_grad says so
// (train.mxfp8_dense, OLMo-core 3's MXFP8 linear; the shared expert under mxfp8_expert_wgrad), both
// quantised along the tokens from fp32 (rows zero-padded to a multiple of 32: a zero adds nothing
// to a block's amax or its sum, so the padding changes no code, no scale and no product;
// OLMo-core's MXFP8Linear asserts tokens % 32 == 0 instead), re-quantised rather than
// byte-transposed; else it is a GEMM in the caller's precision (bf16) on dy and x (the shared
// expert in OLMo-core's recipe). The MX codes are temporaries in buffers of the calling thread that
// keep their capacity across calls.
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

// The calling thread's bf16 scratch copies that round_once writes: the layer input that q, k and
// v read (the attention block's while it uses it), and an output gradient that dx and dw read
// (linear_backward's own).
enum class Bf16Slot { kLayerInput, kOutputGrad };

// x [rows, cols] rounded to bf16 once for the several bf16 GEMMs that read it, into the calling
// thread's scratch `slot` on x's device (capacity kept across calls); valid until the slot's next
// use. A GEMM would otherwise round it again for each of them: a pass over fp32 x each.
ConstTensorView round_once(const float* x, int64_t rows, int64_t cols, Bf16Slot slot);

// An activation or output gradient as linear layers' GEMMs read it: its fp32 values, and its
// bf16 rounding where the caller made it once (round_once) for several bf16 GEMMs without MX
// caches; those read the rounding, which gives the products of the values (kernels::matmul's
// rule). Or its bf16 bits alone, where nothing but bf16 GEMMs without MX caches reads it (a dense
// MLP's SwiGLU output and its gradient, model/swiglu_mlp.h).
struct LinearInput {
  LinearInput(const float* x) : values(x) {}  // NOLINT: implicit, the plain case
  LinearInput(const float* x, ConstTensorView rounded) : values(x), bf16(rounded) {}
  explicit LinearInput(ConstTensorView bits) : values(nullptr), bf16(bits) {}
  const float* values;   // nullptr: bf16 bits alone
  ConstTensorView bf16;  // empty: the GEMMs round `values` themselves (or multiply in fp32)
};

// x [rows, cols] for the several linear layers of `w`'s kind that read it (q, k and v): with its
// bf16 rounding (slot kLayerInput) when their GEMMs multiply bf16 bits (on a GPU, or the CPU's
// native bf16 path) without MX caches, else as is.
LinearInput shared_linear_input(kernels::MatmulPrecision precision, const LinearWeight& w,
                                const float* x, int64_t rows, int64_t cols);

void linear_forward(kernels::MatmulPrecision precision, const LinearInput& x, const LinearWeight& w,
                    float* y, int64_t rows, int64_t in, int64_t out);

// dx[N, in] = dy * W (=, or += when accumulate_dx); dW[out, in] += dy^T * x. Where its GEMMs
// multiply bf16 bits (without MX), dy is rounded once for both (slot kOutputGrad) unless it comes
// rounded.
void linear_backward(kernels::MatmulPrecision precision, const LinearInput& dy,
                     const LinearInput& x, const LinearWeight& w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace moecore
