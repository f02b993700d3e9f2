// The MX GEMM on views, the oracle: the scalar MX dot products (kernels/reference/mx_gemm.h), then
// the epilogue of op_declarations.inc element by element.
#include <cmath>
#include <vector>

#include "kernels/mx_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/mx_gemm.h"

namespace moecore::kernels::reference {

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  const MxMatmulArgs g = mx_matmul_args(a, b, c);
  std::vector<float> product(static_cast<size_t>(g.m * g.n));
  mx_gemm(g.m, g.n, g.k, g.a, g.b, product.data(), g.n);
  for (int64_t i = 0; i < g.m * g.n; ++i) {
    const float p = product[static_cast<size_t>(i)];
    g.c[i] = beta == 0.0f ? alpha * p : std::fma(alpha, p, beta * g.c[i]);
  }
}

}  // namespace moecore::kernels::reference
