// matmul, the plain-loop oracle: sums in double over operands rounded as the precision says (a
// bf16 operand read as the fp32 values of its bits).
#include "core/bf16.h"
#include "kernels/matmul_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/weight_values.h"

namespace moecore::kernels::reference {

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, MatmulPrecision precision) {
  const MatmulDims s = matmul_dims(a, trans_a, b, trans_b, c, precision);
  const bool bf16 = precision == MatmulPrecision::kBf16;
  auto operand = [bf16](float v) { return double{bf16 ? round_to_bf16(v) : v}; };
  const std::vector<float> a_values = weight_values("matmul", a);
  const float* ap = a_values.data();
  const std::vector<float> b_values = weight_values("matmul", b);
  const float* bp = b_values.data();
  float* cp = c.data<float>("matmul");
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < s.k; ++l)
        sum += operand(trans_a ? ap[l * s.m + i] : ap[i * s.k + l]) *
               operand(trans_b ? bp[j * s.k + l] : bp[l * s.n + j]);
      const double old = beta == 0.0f ? 0.0 : double{beta} * double{cp[i * s.n + j]};
      cp[i * s.n + j] = static_cast<float>(double{alpha} * sum + old);
    }
}

}  // namespace moecore::kernels::reference
