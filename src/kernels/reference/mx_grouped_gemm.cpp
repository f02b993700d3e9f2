// The grouped MX GEMMs, the oracle: the scalar MX dot products (kernels/reference/mx_gemm.h),
// expert by expert.
#include "kernels/mx_checks.h"
#include "kernels/ops.h"
#include "kernels/reference/mx_gemm.h"

namespace moecore::kernels::reference {

namespace {

void mx_grouped_gemm(const char* op, const MxOperandView& a, const MxOperandView& b,
                     ConstTensorView expert_offsets, TensorView out) {
  const MxGroupedArgs g = mx_grouped_args(op, a, b, expert_offsets, out);
  const std::span<const int64_t> offsets = host_expert_offsets(op, expert_offsets, g.dims);
  const int64_t n = g.dims.out, k = g.dims.in;
  for (int64_t e = 0; e < g.dims.experts; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t count = offsets[static_cast<size_t>(e + 1)] - begin;
    mx_gemm(count, n, k, mx_rows_from(g.a, begin, k), mx_rows_from(g.b, e * n, k),
            g.out + begin * n, n);
  }
}

}  // namespace

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             ConstTensorView expert_offsets, TensorView y) {
  mx_grouped_gemm("mx_grouped_gemm_forward", x, w, expert_offsets, y);
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    ConstTensorView expert_offsets, TensorView dx) {
  mx_grouped_gemm("mx_grouped_gemm_backward_input", dy, w_transposed, expert_offsets, dx);
}

}  // namespace moecore::kernels::reference
