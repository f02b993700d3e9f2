// Block-wide reductions in a fixed order (*.cu only): a butterfly within each warp, then the same
// over the warps' values, so every thread gets the same bits and the result does not depend on
// scheduling (no atomics). blockDim.x must be a multiple of 32 (any number of warps up to 32);
// every thread of the block must call it (it has barriers).
#pragma once

#include <cstdint>

namespace moecore::kernels::cuda {

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction over the warp, in every lane: each step combines the same two values in every
// lane, and the operations commute, so the lanes agree bit for bit.
template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The reduction over the block, in every thread. warp_values: 32 entries of shared memory; the
// last barrier lets the next call reuse them (a row loop calls this once per row).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* warp_values) {
  v = warp_reduce(v, op);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  v = warp_reduce(lane < static_cast<int>(blockDim.x / 32) ? warp_values[lane] : identity, op);
  __syncthreads();
  return v;
}

}  // namespace moecore::kernels::cuda
