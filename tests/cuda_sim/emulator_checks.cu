// Kernels that break the rules the emulation enforces (test_emulator.cpp launches them and expects
// each failure), and one that keeps them, as CUDA source: rewritten and compiled like the
// backend's kernels (cmake/cuda_sim.cmake), never by nvcc.
#include "emulator_checks.h"

namespace cudasim_checks {
namespace {

// Threads below 16 wait at one barrier, the others at another.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Half the block returns before the barrier the other half waits at.
__global__ void early_return_kernel(int* out) {
  if (threadIdx.x % 2 == 1) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Lanes 0-7 shuffle with a full mask; the other lanes never reach it.
__global__ void partial_shuffle_kernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 8) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// The block's sum through warp shuffles and shared memory: the rules kept.
__global__ void block_sum_kernel(const float* in, float* out) {
  __shared__ float warp_sums[32];
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned int w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}

// Reads its dynamic shared memory's last float.
__global__ void dynamic_shared_kernel(float* out, int floats) {
  extern __shared__ float scratch[];
  scratch[floats - 1] = 2.0f;
  __syncthreads();
  out[0] = scratch[floats - 1];
}

__global__ void write_one_kernel(int* out) {
  out[0] = 1;
}

// Reads a shared slot no thread wrote.
__global__ void unwritten_shared_kernel(float* out) {
  __shared__ float slots[64];
  if (threadIdx.x < 32) slots[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = slots[threadIdx.x];
}

// 40 KiB of static shared memory next to the launch's dynamic shared memory.
__global__ void large_static_shared_kernel(float* out) {
  __shared__ float big[10 * 1024];
  big[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = big[threadIdx.x];
}

// Lane 0 waits at __syncwarp while the others shuffle.
__global__ void mixed_collectives_kernel(float* out) {
  float v = 1.0f;
  if (threadIdx.x == 0) {
    __syncwarp();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

}  // namespace

void launch_divergent_barrier(int* out, cudaStream_t stream) {
  divergent_barrier_kernel<<<1, 64, 0, stream>>>(out);
}
void launch_early_return(int* out, cudaStream_t stream) {
  early_return_kernel<<<1, 64, 0, stream>>>(out);
}
void launch_partial_shuffle(float* out, cudaStream_t stream) {
  partial_shuffle_kernel<<<1, 32, 0, stream>>>(out);
}
void launch_block_sum(const float* in, float* out, int blocks, int threads, cudaStream_t stream) {
  block_sum_kernel<<<blocks, threads, 0, stream>>>(in, out);
}
void launch_dynamic_shared(float* out, int floats, bool opt_in, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (opt_in &&
      cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    return;
  dynamic_shared_kernel<<<1, 32, bytes, stream>>>(out, floats);
}
void launch_write_one(int* out, unsigned int threads, cudaStream_t stream) {
  write_one_kernel<<<1, threads, 0, stream>>>(out);
}
void launch_unwritten_shared(float* out, cudaStream_t stream) {
  unwritten_shared_kernel<<<1, 64, 0, stream>>>(out);
}
void launch_large_static_shared(float* out, size_t dynamic_bytes, cudaStream_t stream) {
  large_static_shared_kernel<<<1, 32, dynamic_bytes, stream>>>(out);
}
void launch_mixed_collectives(float* out, cudaStream_t stream) {
  mixed_collectives_kernel<<<1, 32, 0, stream>>>(out);
}

}  // namespace cudasim_checks
