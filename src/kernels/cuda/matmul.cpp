// Dense GEMMs through cuBLASLt (gemm_lt.h). In bf16 the operands are rounded to bf16 (a, the
// activations, per call; b unless it is the weights' bf16 copy already) and the products summed
// in fp32: the CPU backend's bf16 rule, with cuBLASLt's summation order.
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
  const float* ap = a.data<float>(kOp);
  float* cp = c.data<float>(kOp);
  if (precision == MatmulPrecision::kFp32) {
    gemm_lt(trans_a, trans_b, s.m, s.n, s.k, alpha, ap, b.data<float>(kOp), CUDA_R_32F, beta, cp);
    return;
  }
  const StreamScratch a16(static_cast<size_t>(a.numel()) * sizeof(uint16_t), stream());
  launch_to_bf16(ap, a16.as<uint16_t>(), a.numel(), stream());
  const bool b_is_bf16 = b.dtype() == DType::kBf16;
  const StreamScratch b16(b_is_bf16 ? 0 : static_cast<size_t>(b.numel()) * sizeof(uint16_t),
                          stream());
  if (!b_is_bf16) launch_to_bf16(b.data<float>(kOp), b16.as<uint16_t>(), b.numel(), stream());
  MOE_CUDA_CHECK(cudaGetLastError());
  gemm_lt(trans_a, trans_b, s.m, s.n, s.k, alpha, a16.as<uint16_t>(),
          b_is_bf16 ? static_cast<const void*>(bf16_bits(kOp, b)) : b16.as<uint16_t>(), CUDA_R_16BF,
          beta, cp);
}

}  // namespace moecore::kernels::cuda
