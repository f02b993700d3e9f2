// The MX GEMMs' operands on GPUs without MX tensor cores, and on Blackwell for the GEMMs
// cuBLASLt's block-scaled kernels do not take (mx_gemm.cpp): each code dequantised as
// mx_dequantize does (mx_codes.cuh, one fp32 multiply) and rounded to bf16 as core/bf16.h's
// float_to_bf16 (nearest even). A code value has at most 4 significant bits and the scale is a
// power of two, so the bf16 value is exact wherever it lies in bf16's normal range (fp32's
// exponent range); NaN stays NaN. mx_dequantize's bf16 output is this too.
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/mx_codes.cuh"

namespace moecore::kernels::cuda {
namespace {

template <MxElem kElem>
__global__ void mx_dequantize_to_bf16_kernel(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                             uint16_t* dst) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float value = mx_device::dequantize_elem<kElem>(codes[i], scales[i / mx_device::kBlock]);
    dst[i] = float_to_bf16_bits(value);
  }
}

}  // namespace

void launch_mx_dequantize_to_bf16(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                  MxElem elem, uint16_t* dst, cudaStream_t stream) {
  if (n <= 0) return;
  if (elem == MxElem::kE4M3)
    mx_dequantize_to_bf16_kernel<MxElem::kE4M3>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(codes, scales, n, dst);
  else
    mx_dequantize_to_bf16_kernel<MxElem::kE5M2>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(codes, scales, n, dst);
}

}  // namespace moecore::kernels::cuda
