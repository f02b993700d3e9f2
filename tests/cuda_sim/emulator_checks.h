// The launchers of emulator_checks.cu (test_emulator.cpp says what each shows).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace cudasim_checks {

void launch_divergent_barrier(int* out, cudaStream_t stream);
void launch_early_return(int* out, cudaStream_t stream);
void launch_partial_shuffle(float* out, cudaStream_t stream);
// out[b] = the sum of in's block b (threads a multiple of 32).
void launch_block_sum(const float* in, float* out, int blocks, int threads, cudaStream_t stream);
// out[0] = 2 through `floats` floats of dynamic shared memory, raising the kernel's limit first
// when opt_in.
void launch_dynamic_shared(float* out, int floats, bool opt_in, cudaStream_t stream);
void launch_write_one(int* out, unsigned int threads, cudaStream_t stream);
// out[t] = a shared slot, which only threads below 32 (of 64) wrote.
void launch_unwritten_shared(float* out, cudaStream_t stream);
// 40 KiB of static shared memory and `dynamic_bytes` of dynamic shared memory.
void launch_large_static_shared(float* out, size_t dynamic_bytes, cudaStream_t stream);
void launch_mixed_collectives(float* out, cudaStream_t stream);

}  // namespace cudasim_checks
