// cuBLASLt's block-scaled FP8 GEMM (Blackwell's MX tensor cores, kind::mxf8f6f4 MMAs): the
// E4M3 / E5M2 codes are the operands, each with its e8m0 scales as
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 (one scale per 32 values along k), fp32 compute, fp32
// C and D. The scales go in cuBLASLt's tiled layout, rearranged into stream-ordered scratch
// (mx_scale_swizzle.cu). cuBLASLt is column-major, so as in gemm_lt.cpp the row-major
// c = a b^T is issued as the column-major c^T = b a^T: our b [n, k] is cuBLASLt's A, stored
// k x n and transposed (ld k), our a [m, k] its B, k x m and not transposed (ld k), c^T is n x m
// (ld n). That is the "TN" layout (both operands k-major), the one cuBLAS requires of FP8 on 12.x
// (10.x takes others too) and the one our operands are already in. A's scales are b's, B's a's.
// Requirements (cuBLAS documentation, cublasLtMatmul: "Narrow Precision Data Types Usage" and
// "Tensor Core Usage", which FP8 kernels must meet): 16-byte aligned pointers and 16-byte leading
// dimensions and rows. The codes' rows are k bytes, k a multiple of 32; c's rows are 4 n bytes, so
// n must be a multiple of 4. Those are checked here rather than left to each cuBLAS version's
// heuristic; the rest (element types, shapes, the device) is the heuristic's answer.
#include "kernels/cuda/mx_gemm_block_scaled.h"

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launchers.h"
#include "kernels/cuda/lt_descriptors.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"

namespace moecore::kernels::cuda {
namespace {

cudaDataType_t code_type(mx::ElemType elem) {
  return elem == mx::ElemType::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// An operand's scales in cuBLASLt's tiled layout, in scratch that lives as long as this object
// (released after the work issued until then). Allocated when made, filled by fill() once the
// GEMM is known to run.
class TiledScales {
 public:
  TiledScales(int64_t rows, int64_t blocks)
      : rows_(rows),
        blocks_(blocks),
        scratch_(static_cast<size_t>(mx_swizzled_scale_bytes(rows, blocks)), stream()) {}
  void fill(const char* op, const uint8_t* scales) const {
    launch_mx_swizzle_scales(scales, rows_, blocks_, scratch_.as<uint8_t>(), stream());
    MOE_CUDA_CHECK_LAUNCH(op, "launch_mx_swizzle_scales");
  }
  const void* data() const { return scratch_.as<uint8_t>(); }

 private:
  int64_t rows_, blocks_;
  StreamScratch scratch_;
};

}  // namespace

bool mx_gemm_block_scaled(const char* op, const mx::MxOperand& a, const mx::MxOperand& b, int64_t m,
                          int64_t n, int64_t k, float alpha, float beta, float* c) {
  if (m == 0 || n == 0) return true;  // c is empty
  // cuBLAS's FP8 type tables have no e5m2 x e5m2 GEMM; the bf16 path takes it.
  if (a.elem == mx::ElemType::kE5M2 && b.elem == mx::ElemType::kE5M2) return false;
  // c's rows must be 16 bytes apart and every operand 16-byte aligned (see the top).
  if (n % 4 != 0 || lt::alignment_of(a.codes) < 16 || lt::alignment_of(b.codes) < 16 ||
      lt::alignment_of(c) < 16)
    return false;

  const int64_t blocks = k / mx::kMxBlock;
  const TiledScales a_scales(m, blocks), b_scales(n, blocks);
  lt::MatmulDesc matmul;
  matmul.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  matmul.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  const auto vec32 = static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
  matmul.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, vec32);
  matmul.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, vec32);
  matmul.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scales.data());
  matmul.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scales.data());
  const lt::Layout b_layout(code_type(b.elem), k, n);
  const lt::Layout a_layout(code_type(a.elem), k, m);
  const lt::Layout c_layout(CUDA_R_32F, n, m);

  lt::Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kGemmWorkspaceBytes);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt::alignment_of(b.codes));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, lt::alignment_of(a.codes));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, lt::alignment_of(c));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, lt::alignment_of(c));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(), matmul.get(), b_layout.get(), a_layout.get(), c_layout.get(),
      c_layout.get(), preference.get(), 1, &heuristic, &found);
  // A result whose own state is not success carries no usable algorithm (as in gemm_lt.cpp):
  // the bf16 path runs this GEMM rather than cublasLtMatmul failing on it.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
      (status == CUBLAS_STATUS_SUCCESS && (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS)))
    return false;
  MOE_CUBLAS_CHECK(status);

  a_scales.fill(op, a.scales);
  b_scales.fill(op, b.scales);
  MOE_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), matmul.get(), &alpha, b.codes, b_layout.get(),
                                  a.codes, a_layout.get(), &beta, c, c_layout.get(), c,
                                  c_layout.get(), &heuristic.algo, gemm_workspace(),
                                  kGemmWorkspaceBytes, stream()));
  MOE_CUDA_CHECK_LAUNCH(op, "cublasLtMatmul (block-scaled)");
  return true;
}

}  // namespace moecore::kernels::cuda
