// MX quantisation and dequantisation kernels, bit-identical to kernels/reference (the scalar rules
// of core/mx_types.cpp, mirrored line by line in mx_codes.cuh). Quantisation runs one thread per
// block of 32 values: along a row (32 consecutive floats) or, transposed, down a column (32 floats
// `cols` apart, neighbouring threads on neighbouring columns so that each load is coalesced).
// Dequantisation runs one thread per element.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/mx_codes.cuh"

namespace moecore::kernels::cuda {
namespace {

using mx_device::kBlock;

// Block q of the row-major x: values x[32 q ..], codes[32 q ..], scales[q] (a row of cols values
// holds cols / 32 whole blocks, so the blocks of all rows are consecutive).
template <MxElem kElem>
__global__ void mx_quantize_kernel(const float* x, int64_t blocks, MxScaleRule rule, uint8_t* codes,
                                   uint8_t* scales) {
  for (int64_t q = grid_first(); q < blocks; q += grid_stride()) {
    mx_device::quantize_block<kElem>(rule, x + q * kBlock, 1, codes + q * kBlock, scales + q);
  }
}

// Thread t: column c = t % cols, row block b, matrix m of x [batch, rows, cols]; its block is
// row out_row = m cols + c of codes [batch cols, rows] and scales [batch cols, rows / 32].
template <MxElem kElem>
__global__ void mx_quantize_transposed_kernel(const float* x, int64_t batch, int64_t rows,
                                              int64_t cols, MxScaleRule rule, uint8_t* codes,
                                              uint8_t* scales) {
  const int64_t row_blocks = rows / kBlock;
  const int64_t total = batch * row_blocks * cols;
  for (int64_t t = grid_first(); t < total; t += grid_stride()) {
    const int64_t c = t % cols, b = (t / cols) % row_blocks, m = t / cols / row_blocks;
    const int64_t out_row = m * cols + c;
    mx_device::quantize_block<kElem>(rule, x + (m * rows + b * kBlock) * cols + c, cols,
                                     codes + out_row * rows + b * kBlock,
                                     scales + out_row * row_blocks + b);
  }
}

template <MxElem kElem>
__global__ void mx_dequantize_kernel(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                     float* x) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    x[i] = mx_device::dequantize_elem<kElem>(codes[i], scales[i / kBlock]);
  }
}

}  // namespace

void launch_mx_quantize(const float* x, int64_t rows, int64_t cols, MxElem elem, MxScaleRule rule,
                        uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / kBlock);
  if (blocks <= 0) return;
  if (elem == MxElem::kE4M3)
    mx_quantize_kernel<MxElem::kE4M3><<<elementwise_blocks(blocks), kElementThreads, 0, stream>>>(
        x, blocks, rule, codes, scales);
  else
    mx_quantize_kernel<MxElem::kE5M2><<<elementwise_blocks(blocks), kElementThreads, 0, stream>>>(
        x, blocks, rule, codes, scales);
}

void launch_mx_quantize_transposed(const float* x, int64_t batch, int64_t rows, int64_t cols,
                                   MxElem elem, MxScaleRule rule, uint8_t* codes, uint8_t* scales,
                                   cudaStream_t stream) {
  const int64_t blocks = batch * (rows / kBlock) * cols;
  if (blocks <= 0) return;
  if (elem == MxElem::kE4M3)
    mx_quantize_transposed_kernel<MxElem::kE4M3>
        <<<elementwise_blocks(blocks), kElementThreads, 0, stream>>>(x, batch, rows, cols, rule,
                                                                     codes, scales);
  else
    mx_quantize_transposed_kernel<MxElem::kE5M2>
        <<<elementwise_blocks(blocks), kElementThreads, 0, stream>>>(x, batch, rows, cols, rule,
                                                                     codes, scales);
}

void launch_mx_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t n, MxElem elem,
                          float* x, cudaStream_t stream) {
  if (n <= 0) return;
  if (elem == MxElem::kE4M3)
    mx_dequantize_kernel<MxElem::kE4M3>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(codes, scales, n, x);
  else
    mx_dequantize_kernel<MxElem::kE5M2>
        <<<elementwise_blocks(n), kElementThreads, 0, stream>>>(codes, scales, n, x);
}

}  // namespace moecore::kernels::cuda
