// The operand precision of each module kind's GEMMs (kernels/matmul_precision.h): a per-module
// recipe rather than one process-wide flag, so that a module whose outputs must stay exact (the
// router: its logits pick the experts) keeps fp32 while the others multiply in bf16, and MXFP8 is
// given to the modules that tolerate it. Weights, gradients and optimizer state stay fp32 whatever
// the recipe says.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/mx_types.h"
#include "kernels/matmul_precision.h"

namespace moecore {

// train.precision.
enum class TrainPrecision : uint8_t { kFp32, kBf16, kMxfp8 };

// The variants of train.precision = "mxfp8" (train.mxfp8_*), OLMo-core 3's recipe when all are
// off (its MoERowwiseFP8Config, which drives the routed experts and, through the block's
// rowwise_fp8, the shared experts: olmo_core/nn/moe/v2/no_ep.py, fp8.py): the routed and shared
// experts' forward and input-gradient GEMMs in MXFP8 (E4M3 elements, rceil scales) on weights
// quantised once per optimizer step, their weight-gradient GEMM in bf16 (the routed experts' on
// the inputs dequantised from the saved MXFP8 copies, the shared experts' on the bf16 inputs, as
// OLMo-core saves them: fp8.py passes the shared experts no prequantised input), everything else
// in bf16 but the router (fp32).
struct Mxfp8Options {
  bool expert_wgrad = false;  // the routed and shared experts' weight-gradient GEMMs in MXFP8 too
  bool dense = false;         // attention projections and dense layers' MLPs in MXFP8 (all GEMMs)
  mx::ScaleMode scale_mode = mx::ScaleMode::kRceil;  // "rceil" | "floor"
};

// Which GEMMs run on MX operands. A module marked here multiplies its other GEMMs (and anything
// it runs outside the MX GEMMs) in its PrecisionRecipe entry, bf16.
struct MxRecipe {
  // Forward (x . w^T) and input gradient (dy . w) of the routed and the shared experts.
  bool experts = false;
  bool expert_wgrad = false;  // and their weight gradient (dy^T . x, both along the tokens)
  bool attention = false;     // q/k/v/o projections: all three GEMMs (not the attention core)
  bool dense_mlp = false;     // dense layers' MLP: all three GEMMs
  mx::ScaleMode scale_mode = mx::ScaleMode::kRceil;
};

struct PrecisionRecipe {
  using Precision = kernels::MatmulPrecision;
  Precision router = Precision::kFp32;
  Precision attention = Precision::kFp32;  // q/k/v/o projections and the attention core
  Precision experts = Precision::kFp32;    // the routed experts' grouped GEMMs
  // Dense layers' SwiGLU MLP and the shared expert (under mx.experts: the shared expert's GEMMs
  // that are not MX, its bf16 weight gradient without mx.expert_wgrad).
  Precision dense_mlp = Precision::kFp32;
  Precision lm_head = Precision::kFp32;
  MxRecipe mx;

  // fp32 everywhere, or bf16 everywhere but the router.
  static PrecisionRecipe from_train_precision(Precision precision) {
    return {.router = Precision::kFp32,
            .attention = precision,
            .experts = precision,
            .dense_mlp = precision,
            .lm_head = precision,
            .mx = {}};
  }

  // The recipe of train.precision: mxfp8 is the bf16 recipe with the MX GEMMs of `options`.
  static PrecisionRecipe from_train(TrainPrecision precision, const Mxfp8Options& options) {
    if (precision == TrainPrecision::kFp32) return from_train_precision(Precision::kFp32);
    PrecisionRecipe recipe = from_train_precision(Precision::kBf16);
    if (precision == TrainPrecision::kMxfp8)
      recipe.mx = {.experts = true,
                   .expert_wgrad = options.expert_wgrad,
                   .attention = options.dense,
                   .dense_mlp = options.dense,
                   .scale_mode = options.scale_mode};
    return recipe;
  }
};

// What the routed experts keep of their inputs (x, and the SwiGLU output act) for the backward,
// whose GEMMs are all that read them there: what those GEMMs multiply.
enum class KeptExpertInputs : uint8_t {
  kFp32,  // fp32 GEMMs (and MXFP8 with mx.expert_wgrad, which quantises the fp32 values)
  kBf16,  // bf16 GEMMs: the bf16 roundings, which give their products exactly
  kMx,    // OLMo-core's MXFP8 recipe: the forward's MX copies, dequantised for the wgrad
};

inline KeptExpertInputs kept_expert_inputs(const PrecisionRecipe& recipe) {
  if (recipe.mx.experts)
    return recipe.mx.expert_wgrad ? KeptExpertInputs::kFp32 : KeptExpertInputs::kMx;
  return recipe.experts == kernels::MatmulPrecision::kBf16 ? KeptExpertInputs::kBf16
                                                           : KeptExpertInputs::kFp32;
}

// The two users of model/swiglu_mlp.h.
enum class SwigluMlp : uint8_t { kDenseLayer, kSharedExpert };

// Whether `mlp`'s linears carry MX caches: dense layers' under mx.dense_mlp, the shared expert's
// under mx.experts (OLMo-core runs it as an expert).
inline bool mx_swiglu_mlp(const MxRecipe& mx, SwigluMlp mlp) {
  return mlp == SwigluMlp::kDenseLayer ? mx.dense_mlp : mx.experts;
}

// The dtype in which a dense SwiGLU MLP (a dense layer's, the shared expert) keeps its SwiGLU
// output and writes that output's gradient, which only its GEMMs read (the down projection's
// forward and weight gradient; the gate/up projection's input and weight gradients): bf16 where
// those are bf16 GEMMs without MX caches (the rounding of the fp32 values that they made
// themselves before), else fp32 (an MX GEMM quantises the fp32 values). As for the experts'
// inputs, on every backend.
inline DType kept_mlp_act_dtype(const PrecisionRecipe& recipe, SwigluMlp mlp) {
  return recipe.dense_mlp == kernels::MatmulPrecision::kBf16 && !mx_swiglu_mlp(recipe.mx, mlp)
             ? DType::kBf16
             : DType::kF32;
}

inline const char* train_precision_name(TrainPrecision precision) {
  switch (precision) {
    case TrainPrecision::kFp32:
      return "fp32";
    case TrainPrecision::kBf16:
      return "bf16";
    case TrainPrecision::kMxfp8:
      return "mxfp8";
  }
  return "?";
}

}  // namespace moecore
