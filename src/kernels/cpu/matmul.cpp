// matmul on the CPU: the views handed to kernels/gemm.h's GEMM (oneDNN).
#include "kernels/cpu/ops.h"
#include "kernels/matmul_checks.h"

namespace moecore::kernels::cpu {

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, MatmulPrecision precision) {
  const MatmulDims s = matmul_dims(a, trans_a, b, trans_b, c, precision);
  if (b.dtype() == DType::kBf16) {
    gemm_bf16_b16(bf16_gemm_path(), trans_a, trans_b, s.m, s.n, s.k, alpha, a.data<float>("matmul"),
                  a.size(1), bf16_bits("matmul", b), beta, c.data<float>("matmul"), s.n);
    return;
  }
  gemm(precision, trans_a, trans_b, s.m, s.n, s.k, alpha, a.data<float>("matmul"), a.size(1),
       b.data<float>("matmul"), b.size(1), beta, c.data<float>("matmul"), s.n);
}

}  // namespace moecore::kernels::cpu
