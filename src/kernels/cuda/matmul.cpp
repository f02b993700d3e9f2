// Dense GEMMs through cuBLASLt (gemm_lt.h). In bf16 the operands are rounded to bf16 (a, the
// activations, per call unless the caller rounded them once for several GEMMs; b unless it is the
// weights' bf16 copy already) and the products summed in fp32: the CPU backend's bf16 rule, with
// cuBLASLt's summation order.
#include "core/dtype.h"
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/matmul_checks.h"

namespace moecore::kernels::cuda {

void matmul(ConstTensorView a, bool trans_a, ConstTensorView b, bool trans_b, float alpha,
            float beta, TensorView c, MatmulPrecision precision) {
  constexpr const char* kOp = "matmul";
  const MatmulDims s = matmul_dims(a, trans_a, b, trans_b, c, precision, Device::kCuda);
  float* cp = c.data<float>(kOp);
  if (precision == MatmulPrecision::kFp32) {
    gemm_lt(kOp, trans_a, trans_b, s.m, s.n, s.k, alpha, a.data<float>(kOp), b.data<float>(kOp),
            CUDA_R_32F, beta, cp);
    return;
  }
  // Each operand as bf16: its own bits, or converted into stream scratch.
  const bool a_is_bf16 = a.dtype() == DType::kBf16, b_is_bf16 = b.dtype() == DType::kBf16;
  const StreamScratch a16(a_is_bf16 ? 0 : static_cast<size_t>(a.numel()) * sizeof(uint16_t),
                          stream());
  if (!a_is_bf16) launch_to_bf16(a.data<float>(kOp), a16.as<uint16_t>(), a.numel(), stream());
  const StreamScratch b16(b_is_bf16 ? 0 : static_cast<size_t>(b.numel()) * sizeof(uint16_t),
                          stream());
  if (!b_is_bf16) launch_to_bf16(b.data<float>(kOp), b16.as<uint16_t>(), b.numel(), stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_to_bf16");
  gemm_lt(kOp, trans_a, trans_b, s.m, s.n, s.k, alpha,
          a_is_bf16 ? static_cast<const void*>(bf16_bits(kOp, a)) : a16.as<uint16_t>(),
          b_is_bf16 ? static_cast<const void*>(bf16_bits(kOp, b)) : b16.as<uint16_t>(), CUDA_R_16BF,
          beta, cp);
}

}  // namespace moecore::kernels::cuda
