// The experts' grouped GEMM with the row offsets in device memory: what a training step needs to
// run without the host waiting for the routing (issue 15 item 3). One launch covers every expert:
// its grid has as many row tiles as any routing of `rows_capacity` rows over `experts` experts can
// need (rows_capacity / 64 + experts), and each block finds its expert and tile by reading the
// offsets; blocks past the last tile of this routing return at once.
//
// A first, plain tensor-core kernel (WMMA bf16 16x16x16 fragments, fp32 accumulation, 64 x 64
// output tiles, scalar operand loads): correctness and the launch shape first. Its speed against
// cuBLASLt is what bench/cuda/gemm.cpp measures; the per-expert cuBLASLt path (grouped_gemm.cpp)
// stays the operation's implementation until this one measurably wins.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moecore::kernels::cuda {

// y[offsets[e] .. offsets[e + 1]) (=) x[those rows] . w[e]^T for every expert e < experts:
// x [rows_capacity, in] and w [experts, out, in] as bf16 bits, y [rows_capacity, out] fp32 (rows
// past offsets[experts] untouched), offsets [experts + 1] int64 in device memory, nondecreasing
// from 0 to at most rows_capacity.
void launch_grouped_gemm_bf16_device_offsets(const uint16_t* x, const uint16_t* w,
                                             const int64_t* offsets, int64_t experts,
                                             int64_t rows_capacity, int64_t out, int64_t in,
                                             float* y, cudaStream_t stream);

}  // namespace moecore::kernels::cuda
