// The MX GEMM on views: the exact SIMD kernel (kernels/cpu/mx_gemm.h) writes the product straight
// into c when alpha = 1 and beta = 0 (the common case), else into a buffer that the epilogue
// combines with c.
#include <cmath>
#include <vector>

#include "kernels/cpu/mx_gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cpu {

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  const MxMatmulArgs g = mx_matmul_args(a, b, c);
  if (alpha == 1.0f && beta == 0.0f) {
    cpu::mx_gemm(g.m, g.n, g.k, g.a, g.b, g.c, g.n);
    return;
  }
  // The product in a buffer of the calling thread that keeps its capacity across calls, so that
  // a training step's accumulating MX GEMMs (the shared expert's input gradient added into the
  // block's dx, an MXFP8 linear's weight gradient) ask the heap for nothing once the first step
  // has sized it (tests/alloc). The loop below reads it through a pointer: a thread_local named
  // inside the parallel region would be each worker's own, empty one.
  thread_local std::vector<float> product_buffer;
  product_buffer.resize(static_cast<size_t>(g.m * g.n));
  const float* product = product_buffer.data();
  cpu::mx_gemm(g.m, g.n, g.k, g.a, g.b, product_buffer.data(), g.n);
  const int64_t count = g.m * g.n;
  // The epilogue as op_declarations.inc states it; std::fma spells the single rounding out, so
  // that no compiler contraction can make it differ from the reference.
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
  for (int64_t i = 0; i < count; ++i) {
    const float p = product[i];
    g.c[i] = beta == 0.0f ? alpha * p : std::fma(alpha, p, beta * g.c[i]);
  }
}

}  // namespace moecore::kernels::cpu
