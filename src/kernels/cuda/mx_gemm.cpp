// The MX GEMMs (kernels/op_declarations.inc): c = alpha a b^T + beta c on MX operands quantised
// along k, and the grouped forms, one such GEMM per expert with rows. Two paths, by the device.
//
// Blackwell (compute capability 10.x data-centre, 11.x, 12.x GeForce / workstation): cuBLASLt's
// block-scaled FP8 GEMM on the codes and scales themselves, fp32 accumulation and output, on the
// MX tensor cores (mx_gemm_block_scaled.cpp; the scales rearranged into cuBLASLt's tiled layout by
// mx_scale_swizzle.cu). cuBLAS documents CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 from compute
// capability 10.0 on, 12.x included (there in the TN layout only, the one used here), hence the
// gate compute_major >= 10; what cuBLAS has no kernel for on a given device and version is its
// heuristic's answer. A GEMM it rules out, or that the checks there rule out (e5m2 x e5m2, which
// cuBLAS's FP8 tables lack; n % 4 != 0 or a pointer below 16-byte alignment, which its FP8 kernels
// require), takes the bf16 path below instead, GEMM by GEMM. Its results are within an fp32
// summation error of the CPU backend's (cuBLASLt's own summation order, as below; the products
// of two codes are exact, the scales powers of two); a NaN scale (255) is UE8M0's NaN to cuBLASLt
// as to the reference. This path has never run on a GPU: the project has no Blackwell (its H200
// is Hopper). It runs on an emulated one (ctest CudaSim.Blackwell: tests/cuda_sim's cuBLASLt
// reads the scales where the cuBLAS documentation puts them and sums as the reference does),
// where the per-op harness's MX cases (tests/cpp/test_kernel_ops_mx.cpp) take it: mx_matmul's
// case with n a multiple of 4 (17 x 32 x 96, in e4m3 x e4m3 and both mixed pairs, every epilogue)
// and the grouped GEMMs' experts whose out (forward) or in (backward) is one, all equal to the
// reference; a wrong tile order or scale gives an NMSE of 1e-2 .. 1 there. What the emulation
// cannot show is cuBLAS's own answer: whether its heuristic has a kernel for these shapes, and
// its summation order. Note also that the build's sm_100a machine code (no PTX) loads on compute
// capability 10.0 only, so on other Blackwells none of the backend's kernels run until the build
// adds their targets.
//
// Below compute capability 10 (Hopper, sm_90), no MX tensor cores: each operand is dequantised to
// bf16 (mx_gemm.cu: code value times 2^(scale - 127), exact in bf16 for every element whose value
// lies in bf16's normal range; a NaN scale gives NaN elements) into stream-ordered scratch, then
// multiplied by cuBLASLt in bf16 with fp32 accumulation (gemm_lt.h: a [M, K], b [N, K] -> c = alpha
// a b^T + beta c; beta = 0 does not read c). The products of two such elements are exact in fp32,
// but cuBLASLt sums them in its own order, not the reference's block by block
// (kernels/reference/mx_gemm.h): NOT bit-identical to the CPU backend, within an fp32 summation
// error of it (the backend's table says so: KernelBackend::mx_gemm_bit_exact is false). Elements
// beyond fp32's range once scaled (a code near the largest with scale code 254) overflow here
// where the reference, which scales block sums, may stay finite; quantised real data never gets
// there.
//
// The grouped GEMMs' expert offsets are on the device (order_routes_by_expert writes them there);
// the per-expert GEMMs are issued from the host, so they are read back first, which waits for the
// stream. In a stream being captured into a CUDA graph they are not: both operands are
// dequantised to bf16 whole and one device-offset launch (grouped_gemm_device.h) multiplies them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kernels/cuda/device_views.h"
#include "kernels/cuda/expert_offsets_on_host.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/grouped_gemm_device.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/mx_device_types.h"
#include "kernels/cuda/mx_gemm_block_scaled.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/mx_checks.h"

namespace moecore::kernels::cuda {
namespace {

// `elements` values of an MX operand (whole rows: a multiple of 32 from its first code), as bf16
// in scratch that lives as long as this object (released after the work issued until then), for
// operation op.
class Bf16Operand {
 public:
  Bf16Operand(const char* op, const mx::MxOperand& operand, int64_t elements)
      : op_(op), scratch_(static_cast<size_t>(elements) * sizeof(uint16_t), stream()) {
    load(operand, elements);
  }
  // Overwrites the buffer with `elements` (at most those of the constructor) values of another
  // operand; stream order keeps it from overtaking the GEMMs that read the previous ones.
  void load(const mx::MxOperand& operand, int64_t elements) {
    launch_mx_dequantize_to_bf16(operand.codes, operand.scales, elements, device_elem(operand.elem),
                                 scratch_.as<uint16_t>(), stream());
    MOE_CUDA_CHECK_LAUNCH(op_, "launch_mx_dequantize_to_bf16");
  }
  const uint16_t* at(int64_t element) const { return scratch_.as<uint16_t>() + element; }

 private:
  const char* op_;
  StreamScratch scratch_;
};

// c = alpha a b^T + beta c through bf16: both operands dequantised, one cuBLASLt bf16 GEMM.
void mx_gemm_bf16(const char* op, const mx::MxOperand& a, const mx::MxOperand& b, int64_t m,
                  int64_t n, int64_t k, float alpha, float beta, float* c) {
  const Bf16Operand a16(op, a, m * k);
  const Bf16Operand b16(op, b, n * k);
  gemm_lt(op, false, true, m, n, k, alpha, a16.at(0), b16.at(0), CUDA_R_16BF, beta, c);
}

// Whether the device has MX tensor cores (see the top of this file). Asked once: the backend runs
// on the one device activate() chose for the process, and the driver's answer takes a while.
bool has_mx_tensor_cores() {
  static const bool has = has_mx_tensor_cores(current_device_info());
  return has;
}

// One MX GEMM: block-scaled where cuBLASLt has a kernel for it, else through bf16.
void mx_gemm(const char* op, const mx::MxOperand& a, const mx::MxOperand& b, int64_t m, int64_t n,
             int64_t k, float alpha, float beta, float* c) {
  if (has_mx_tensor_cores() && mx_gemm_block_scaled(op, a, b, m, n, k, alpha, beta, c)) return;
  mx_gemm_bf16(op, a, b, m, n, k, alpha, beta, c);
}

// Without MX tensor cores: out[rows of e] (=) = a[rows of e] . b[e]^T for every expert with rows,
// the activations dequantised at once, each such expert's weights into one reused buffer (the
// scratch stays one expert's [n, k] however many experts there are, and experts without rows cost
// nothing).
void mx_grouped_gemm_bf16(const char* op, const MxGroupedArgs& g,
                          std::span<const int64_t> expert_offsets) {
  const int64_t n = g.dims.out, k = g.dims.in;
  const Bf16Operand a(op, g.a, g.dims.rows * k);
  std::optional<Bf16Operand> b;  // made at the first expert with rows
  for (int64_t e = 0; e < g.dims.experts; ++e) {
    const int64_t begin = expert_offsets[static_cast<size_t>(e)];
    const int64_t count = expert_offsets[static_cast<size_t>(e + 1)] - begin;
    if (count == 0) continue;
    const mx::MxOperand expert = mx_rows_from(g.b, e * n, k);
    if (b)
      b->load(expert, n * k);
    else
      b.emplace(op, expert, n * k);
    gemm_lt(op, false, true, count, n, k, 1.0f, a.at(begin * k), b->at(0), CUDA_R_16BF, 0.0f,
            g.out + begin * n);
  }
}

// out[rows of e] (=) = a[rows of e] . b[e]^T for every expert with rows. With MX tensor cores each
// is one mx_gemm on the expert's rows and weights as they lie (the tiled scales are made per
// GEMM: an expert's rows start at any row, not on a 128-row tile).
void mx_grouped_gemm(const char* op, const MxOperandView& a, const MxOperandView& b,
                     ConstTensorView expert_offsets, TensorView out) {
  const MxGroupedArgs g = mx_grouped_args(op, a, b, expert_offsets, out, Device::kCuda);
  if (experts_in_one_launch()) {
    // In a CUDA graph's capture (or train.cuda_grouped_gemm = "one_launch") the offsets stay on
    // the device: both operands dequantised whole
    // (every expert's weights: the scratch of a bf16 copy of them) and one device-offset launch
    // (grouped_gemm_device.h), on any device: the bf16 path's arithmetic, not the block-scaled.
    const int64_t n = g.dims.out, k = g.dims.in;
    const Bf16Operand a16(op, g.a, g.dims.rows * k);
    const Bf16Operand b16(op, g.b, g.dims.experts * n * k);
    launch_grouped_gemm_bf16_device_offsets(a16.at(0), b16.at(0), expert_offsets.data<int64_t>(op),
                                            g.dims.experts, g.dims.rows, n, k, g.out, stream());
    MOE_CUDA_CHECK_LAUNCH(op, "launch_grouped_gemm_bf16_device_offsets");
    return;
  }
  const std::vector<int64_t> offsets = expert_offsets_on_host(op, expert_offsets, g.dims);
  if (!has_mx_tensor_cores()) {
    mx_grouped_gemm_bf16(op, g, offsets);
    return;
  }
  const int64_t n = g.dims.out, k = g.dims.in;
  for (int64_t e = 0; e < g.dims.experts; ++e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t count = offsets[static_cast<size_t>(e + 1)] - begin;
    if (count == 0) continue;
    mx_gemm(op, mx_rows_from(g.a, begin, k), mx_rows_from(g.b, e * n, k), count, n, k, 1.0f, 0.0f,
            g.out + begin * n);
  }
}

}  // namespace

void mx_matmul(const MxOperandView& a, const MxOperandView& b, float alpha, float beta,
               TensorView c) {
  expect_on_device("mx_matmul", "a", a.codes);
  const MxMatmulArgs g = mx_matmul_args(a, b, c, Device::kCuda);
  mx_gemm("mx_matmul", g.a, g.b, g.m, g.n, g.k, alpha, beta, g.c);
}

void mx_grouped_gemm_forward(const MxOperandView& x, const MxOperandView& w,
                             ConstTensorView expert_offsets, TensorView y) {
  constexpr const char* kOp = "mx_grouped_gemm_forward";
  expect_on_device(kOp, "x", x.codes);
  mx_grouped_gemm(kOp, x, w, expert_offsets, y);
}

void mx_grouped_gemm_backward_input(const MxOperandView& dy, const MxOperandView& w_transposed,
                                    ConstTensorView expert_offsets, TensorView dx) {
  constexpr const char* kOp = "mx_grouped_gemm_backward_input";
  expect_on_device(kOp, "dy", dy.codes);
  mx_grouped_gemm(kOp, dy, w_transposed, expert_offsets, dx);
}

}  // namespace moecore::kernels::cuda
