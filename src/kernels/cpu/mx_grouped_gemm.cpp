// The grouped MX GEMMs on the CPU: one exact MX GEMM (kernels/cpu/mx_gemm.h) per expert with
// rows, threaded as the bf16 / fp32 grouped GEMM is (kernels/cpu/expert_parallel_for.h): inside
// the parallel-experts region each MX GEMM runs on one thread. The threading changes no bits: every
// output is one fixed-order dot product.
#include "kernels/cpu/expert_parallel_for.h"
#include "kernels/cpu/mx_gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cpu {

namespace {

// out[rows of e] = a[rows of e] . b[e]^T for every expert with rows.
void mx_grouped_gemm(const char* op, const MxOperandView& a, const MxOperandView& b,
                     ConstTensorView expert_offsets, TensorView out) {
  const MxGroupedArgs g = mx_grouped_args(op, a, b, expert_offsets, out);
  const std::span<const int64_t> offsets = host_expert_offsets(op, expert_offsets, g.dims);
  const int64_t n = g.dims.out, k = g.dims.in;
  for_each_expert(offsets, g.dims.experts, [&](int64_t e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t count = offsets[static_cast<size_t>(e + 1)] - begin;
    cpu::mx_gemm(count, n, k, mx_rows_from(g.a, begin, k), mx_rows_from(g.b, e * n, k),
                 g.out + begin * n, n);
  });
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

}  // namespace moecore::kernels::cpu
