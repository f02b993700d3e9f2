// The experts' grouped GEMMs with the row offsets in device memory: what a training step needs to
// run without the host waiting for the routing (issue 15 item 3). One launch covers every expert:
// the row-tiled kernels' grid has as many row tiles as any routing of `rows_capacity` rows over
// `experts` experts can need (rows_capacity / 128 + experts), and each block finds its expert and
// tile by reading the offsets; blocks past the last tile of this routing return at once. The
// weight gradient has a block per (expert, 128 x 128 tile of the weight), each summing over its
// expert's rows.
//
// Tensor-core kernels (WMMA bf16 16x16x16 fragments, fp32 accumulation): 128 x 128 output tiles
// of eight warps (64 x 32 each), 32 of the contraction per step, the next step's operands loaded
// into registers while the tensor cores work on this one, 16-byte loads where the operands are
// 16-byte aligned with rows of a multiple of 8 values (else one value at a time), fragments
// wholly past the rows or columns skipped. Their speed against cuBLASLt is what
// bench/cuda/gemm.cpp measures; the per-expert cuBLASLt path (grouped_gemm.cpp) stays the
// operation's implementation except where the host must not wait: in a stream being captured
// into a CUDA graph, which a host read would break.
// Offsets: [experts + 1] int64 in device memory, nondecreasing from 0 to at most rows_capacity;
// rows past offsets[experts] are neither read nor written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moecore::kernels::cuda {

// y[offsets[e] .. offsets[e + 1]) (=) x[those rows] . w[e]^T for every expert e < experts:
// x [rows_capacity, in] and w [experts, out, in] as bf16 bits, y [rows_capacity, out] fp32.
void launch_grouped_gemm_bf16_device_offsets(const uint16_t* x, const uint16_t* w,
                                             const int64_t* offsets, int64_t experts,
                                             int64_t rows_capacity, int64_t out, int64_t in,
                                             float* y, cudaStream_t stream);

// The input gradient: dx[rows of e] (=) dy[rows of e] . w[e], contracting over out: dy
// [rows_capacity, out] and w [experts, out, in] as bf16 bits, dx [rows_capacity, in] fp32.
void launch_grouped_gemm_bf16_device_offsets_input_grad(const uint16_t* dy, const uint16_t* w,
                                                        const int64_t* offsets, int64_t experts,
                                                        int64_t rows_capacity, int64_t out,
                                                        int64_t in, float* dx, cudaStream_t stream);

// The weight gradient: dw[e] (+=) dy[rows of e]^T . x[rows of e]: dy [rows, out] and x [rows, in]
// as bf16 bits, dw [experts, out, in] fp32; an expert without rows keeps its gradient.
void launch_grouped_gemm_bf16_device_offsets_weight_grad(const uint16_t* dy, const uint16_t* x,
                                                         const int64_t* offsets, int64_t experts,
                                                         int64_t out, int64_t in, float* dw,
                                                         cudaStream_t stream);

}  // namespace moecore::kernels::cuda
