// SwiGLU: one (row, hidden unit) per thread in a grid-stride loop; each output depends on its own
// inputs only, so there is no order to fix. The CPU backend's expressions (kernels/cpu/swiglu.cpp),
// expf in full precision (no fast math). A bf16 output (read only by bf16 GEMMs) holds the fp32
// value rounded as core/bf16.h's float_to_bf16, in the same pass.
#include "kernels/cuda/bf16_bits.cuh"
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

template <typename Out>
__global__ void swiglu_forward_kernel(const float* gu, Out* act, int64_t rows, int64_t hidden) {
  const int64_t n = rows * hidden;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / hidden, j = i - r * hidden;
    const float g = gu[r * 2 * hidden + j], u = gu[r * 2 * hidden + hidden + j];
    const float sig = 1.0f / (1.0f + expf(-g));
    store_value(act + i, g * sig * u);
  }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig)); d/du = silu(g).
template <typename Out>
__global__ void swiglu_backward_kernel(const float* dact, const float* gu, Out* dgu, int64_t rows,
                                       int64_t hidden) {
  const int64_t n = rows * hidden;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / hidden, j = i - r * hidden;
    const int64_t gate = r * 2 * hidden + j, up = gate + hidden;
    const float g = gu[gate], u = gu[up], da = dact[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    store_value(dgu + up, da * (g * sig));
    store_value(dgu + gate, da * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

}  // namespace

template <typename Out>
void launch_swiglu_forward(const float* gu, Out* act, int64_t rows, int64_t hidden,
                           cudaStream_t stream) {
  const int64_t n = rows * hidden;
  if (n > 0)
    swiglu_forward_kernel<Out>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(gu, act, rows, hidden);
}

template <typename Out>
void launch_swiglu_backward(const float* dact, const float* gu, Out* dgu, int64_t rows,
                            int64_t hidden, cudaStream_t stream) {
  const int64_t n = rows * hidden;
  if (n > 0)
    swiglu_backward_kernel<Out>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(dact, gu, dgu, rows, hidden);
}

template void launch_swiglu_forward(const float*, float*, int64_t, int64_t, cudaStream_t);
template void launch_swiglu_forward(const float*, uint16_t*, int64_t, int64_t, cudaStream_t);
template void launch_swiglu_backward(const float*, const float*, float*, int64_t, int64_t,
                                     cudaStream_t);
template void launch_swiglu_backward(const float*, const float*, uint16_t*, int64_t, int64_t,
                                     cudaStream_t);

}  // namespace moecore::kernels::cuda
