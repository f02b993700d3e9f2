#include "kernels/reference/mx_gemm.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace moecore::kernels::reference {

void mx_gemm(int64_t m, int64_t n, int64_t k, const mx::MxOperand& a, const mx::MxOperand& b,
             float* c, int64_t ldc) {
  mx::check_mx_contraction("mx_gemm", k);
  MOE_CHECK(m >= 0 && n >= 0 && ldc >= n, "[mx_gemm] bad shape m={} n={} ldc={}", m, n, ldc);
  const int64_t blocks = k / mx::kMxBlock;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        float sum = 0.0f;
        for (int64_t kk = blk * mx::kMxBlock; kk < (blk + 1) * mx::kMxBlock; ++kk) {
          sum += mx::decode_elem(a.elem, a.codes[i * k + kk]) *
                 mx::decode_elem(b.elem, b.codes[j * k + kk]);
        }
        const int scale_a = a.scales[i * blocks + blk];
        const int scale_b = b.scales[j * blocks + blk];
        if (scale_a == mx::kE8m0Nan || scale_b == mx::kE8m0Nan) {
          acc += std::numeric_limits<float>::quiet_NaN();
        } else {
          acc += std::ldexp(sum, scale_a + scale_b - 2 * mx::kE8m0Bias);
        }
      }
      c[i * ldc + j] = acc;
    }
  }
}

}  // namespace moecore::kernels::reference
