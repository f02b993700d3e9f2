// matmul on the CPU: the views handed to kernels/gemm.h's GEMM (oneDNN), each bf16 operand (a
// weight copy, an activation rounded once) as it is.
#include "kernels/cpu/ops.h"
#include "kernels/matmul_checks.h"

namespace moecore::kernels::cpu {

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, MatmulPrecision precision) {
  constexpr const char* kOp = "matmul";
  const MatmulDims s = matmul_dims(a, trans_a, b, trans_b, c, precision);
  const bool a_bf16 = a.dtype() == DType::kBf16, b_bf16 = b.dtype() == DType::kBf16;
  float* cp = c.data<float>(kOp);
  if (a_bf16 && b_bf16) {
    gemm_bf16_ab16(bf16_gemm_path(), trans_a, trans_b, s.m, s.n, s.k, alpha, bf16_bits(kOp, a),
                   bf16_bits(kOp, b), beta, cp, s.n);
  } else if (a_bf16) {
    gemm_bf16_a16(bf16_gemm_path(), trans_a, trans_b, s.m, s.n, s.k, alpha, bf16_bits(kOp, a),
                  b.data<float>(kOp), b.size(1), beta, cp, s.n);
  } else if (b_bf16) {
    gemm_bf16_b16(bf16_gemm_path(), trans_a, trans_b, s.m, s.n, s.k, alpha, a.data<float>(kOp),
                  a.size(1), bf16_bits(kOp, b), beta, cp, s.n);
  } else {
    gemm(precision, trans_a, trans_b, s.m, s.n, s.k, alpha, a.data<float>(kOp), a.size(1),
         b.data<float>(kOp), b.size(1), beta, cp, s.n);
  }
}

}  // namespace moecore::kernels::cpu
