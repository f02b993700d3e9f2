// The MX GEMMs on Hopper (sm_90), which has no MX tensor cores: each operand is dequantised to
// bf16 (mx_gemm.cu: code value times 2^(scale - 127), exact in bf16 for every element whose value
// lies in bf16's normal range; a NaN scale gives NaN elements) into stream-ordered scratch, then
// multiplied by cuBLASLt in bf16 with fp32 accumulation (gemm_lt.h: a [M, K], b [N, K] ->
// c = alpha a b^T + beta c; beta = 0 does not read c). The products of two such elements are
// exact in fp32, but cuBLASLt sums them in its own order, not the reference's block by block
// (kernels/reference/mx_gemm.h): NOT bit-identical to the CPU backend, within an fp32 summation
// error of it (the backend's table says so: KernelBackend::mx_gemm_bit_exact is false). Elements
// beyond fp32's range once scaled (a code near the largest with scale code 254) overflow here
// where the reference, which scales block sums, may stay finite; quantised real data never gets
// there.
// The sm_100 path still to write: cuBLASLt's block-scaled FP8 GEMM on the codes and scales
// themselves (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, Blackwell's MX tensor cores).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kernels/cuda/device_views.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/mx_device_types.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cuda {
namespace {

// `elements` values of an MX operand (whole rows: a multiple of 32 from its first code), as bf16
// in scratch that lives as long as this object (released after the work issued until then).
class Bf16Operand {
 public:
  Bf16Operand(const mx::MxOperand& operand, int64_t elements)
      : scratch_(static_cast<size_t>(elements) * sizeof(uint16_t), stream()) {
    load(operand, elements);
  }
  // Overwrites the buffer with `elements` (at most those of the constructor) values of another
  // operand; stream order keeps it from overtaking the GEMMs that read the previous ones.
  void load(const mx::MxOperand& operand, int64_t elements) {
    launch_mx_dequantize_to_bf16(operand.codes, operand.scales, elements, device_elem(operand.elem),
                                 scratch_.as<uint16_t>(), stream());
    MOE_CUDA_CHECK(cudaGetLastError());
  }
  const uint16_t* at(int64_t element) const { return scratch_.as<uint16_t>() + element; }

 private:
  StreamScratch scratch_;
};

// out[rows of e] (=) = a[rows of e] . b[e]^T for every expert with rows: the activations
// dequantised at once, each such expert's weights into one reused buffer (the scratch stays one
// expert's [n, k] however many experts there are, and experts without rows cost nothing).
void mx_grouped_gemm(const MxGroupedArgs& g, std::span<const int64_t> expert_offsets) {
  const int64_t n = g.dims.out, k = g.dims.in;
  const Bf16Operand a(g.a, g.dims.rows * k);
  std::optional<Bf16Operand> b;  // made at the first expert with rows
  for (int64_t e = 0; e < g.dims.experts; ++e) {
    const int64_t begin = expert_offsets[static_cast<size_t>(e)];
    const int64_t count = expert_offsets[static_cast<size_t>(e + 1)] - begin;
    if (count == 0) continue;
    const mx::MxOperand expert = mx_rows_from(g.b, e * n, k);
    if (b)
      b->load(expert, n * k);
    else
      b.emplace(expert, n * k);
    gemm_lt(false, true, count, n, k, 1.0f, a.at(begin * k), b->at(0), CUDA_R_16BF, 0.0f,
            g.out + begin * n);
  }
}

}  // namespace

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  expect_on_device("mx_matmul", "a", a.codes);
  const MxMatmulArgs g = mx_matmul_args(a, b, c, Device::kCuda);
  const Bf16Operand a16(g.a, g.m * g.k);
  const Bf16Operand b16(g.b, g.n * g.k);
  gemm_lt(false, true, g.m, g.n, g.k, alpha, a16.at(0), b16.at(0), CUDA_R_16BF, beta, g.c);
}

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             std::span<const int64_t> expert_offsets, TensorView y) {
  constexpr const char* kOp = "mx_grouped_gemm_forward";
  expect_on_device(kOp, "x", x.codes);
  mx_grouped_gemm(mx_grouped_args(kOp, x, w, expert_offsets, y, Device::kCuda), expert_offsets);
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    std::span<const int64_t> expert_offsets, TensorView dx) {
  constexpr const char* kOp = "mx_grouped_gemm_backward_input";
  expect_on_device(kOp, "dy", dy.codes);
  mx_grouped_gemm(mx_grouped_args(kOp, dy, w_transposed, expert_offsets, dx, Device::kCuda),
                  expert_offsets);
}

}  // namespace moecore::kernels::cuda
