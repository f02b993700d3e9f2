// The operand precision of each module kind's GEMMs (kernels/matmul_precision.h): a per-module
// recipe rather than one process-wide flag, so that a module whose outputs must stay exact (the
// router: its logits pick the experts) keeps fp32 while the others multiply in bf16, and a new
// format (MXFP8 next) can be given to the modules that tolerate it. Weights, gradients and
// optimizer state stay fp32 whatever the recipe says.
#pragma once

#include "kernels/matmul_precision.h"

namespace moecore {

struct PrecisionRecipe {
  using Precision = kernels::MatmulPrecision;
  Precision router = Precision::kFp32;
  Precision attention = Precision::kFp32;  // q/k/v/o projections and the attention core
  Precision experts = Precision::kFp32;    // the routed experts' grouped GEMMs
  Precision dense_mlp = Precision::kFp32;  // dense layers' SwiGLU MLP and the shared expert
  Precision lm_head = Precision::kFp32;

  // The recipe of train.precision: fp32 everywhere, or bf16 everywhere but the router.
  static PrecisionRecipe from_train_precision(Precision precision) {
    return {.router = Precision::kFp32,
            .attention = precision,
            .experts = precision,
            .dense_mlp = precision,
            .lm_head = precision};
  }
};

}  // namespace moecore
