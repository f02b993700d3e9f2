// The grouped MX GEMMs, the oracle: the scalar MX dot products (kernels/reference/mx_gemm.h),
// expert by expert.
#include "kernels/mx_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/mx_gemm.h"

namespace moecore::kernels::reference {

namespace {

void mx_grouped_gemm(const MxGroupedArgs& g, std::span<const int64_t> expert_offsets) {
  const int64_t n = g.dims.out, k = g.dims.in;
  for (int64_t e = 0; e < g.dims.experts; ++e) {
    const int64_t begin = expert_offsets[static_cast<size_t>(e)];
    const int64_t count = expert_offsets[static_cast<size_t>(e + 1)] - begin;
    mx_gemm(count, n, k, mx_rows_from(g.a, begin, k), mx_rows_from(g.b, e * n, k),
            g.out + begin * n, n);
  }
}

}  // namespace

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             std::span<const int64_t> expert_offsets, TensorView y) {
  mx_grouped_gemm(mx_grouped_args("mx_grouped_gemm_forward", x, w, expert_offsets, y),
                  expert_offsets);
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    std::span<const int64_t> expert_offsets, TensorView dx) {
  mx_grouped_gemm(
      mx_grouped_args("mx_grouped_gemm_backward_input", dy, w_transposed, expert_offsets, dx),
      expert_offsets);
}

}  // namespace moecore::kernels::reference
