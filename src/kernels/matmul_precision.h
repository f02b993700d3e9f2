// The operand precision of one GEMM: kFp32 multiplies fp32 operands; kBf16 rounds both operands to
// bf16 and accumulates in fp32 (outputs stay fp32). Every GEMM-backed op takes it explicitly; the
// model picks it per module (model/precision_recipe.h). Weights, gradients, optimizer state and
// everything outside the GEMMs stay fp32 either way.
#pragma once

namespace moecore::kernels {

enum class MatmulPrecision { kFp32, kBf16 };

}  // namespace moecore::kernels
