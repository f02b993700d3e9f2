// MX block scales in the tiled layout cuBLASLt's block-scaled GEMMs read (the cuBLAS
// documentation's "1D block scaling factors layout"; mx_gemm_block_scaled.cpp). Ours are row-major
// [rows, blocks], one e8m0 code per 32 codes along k (blocks = k / 32). cuBLASLt's come in tiles
// of 128 rows x 4 blocks, 512 bytes each, the tiles of a row band (128 rows) one after the other
// along k, then the next band; inside a tile the 128 rows are 4 groups of 32, interleaved so that
// row r's 4 codes sit at (r % 32) * 16 + (r / 32) * 4: the order the tensor cores load them in.
// Scale (r, c) lands at
//   ((r / 128) * (padded_blocks / 4) + c / 4) * 512 + (r % 32) * 16 + (r % 128 / 32) * 4 + c % 4
// (torchao's to_blocked, TransformerEngine's swizzle and CUTLASS's SfKMajorAtom write the same).
// The padding, rows up to a multiple of 128 and blocks up to one of 4, holds scale code 0 (2^-127):
// padded rows give outputs outside c, which cuBLASLt does not store; a padded block lies beyond k
// in both operands, so its products are at most 57344^2 2^-254 < 2^-222 whatever finite codes the
// GEMM reads there, zero in fp32. Not 255 (NaN), which would poison them; 0 is also what torchao
// pads with.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr uint8_t kPadScale = 0;

// One thread per 4 bytes of the destination: a row's 4 consecutive blocks of one tile, contiguous
// there, written as one 32-bit word (the destination is 4-byte aligned; tiles are 512 bytes).
__global__ void mx_swizzle_scales_kernel(const uint8_t* scales, int64_t rows, int64_t blocks,
                                         int64_t tiles_along_k, int64_t words, uint32_t* dst) {
  for (int64_t w = grid_first(); w < words; w += grid_stride()) {
    const int64_t tile = w / 128, within = w % 128;  // 128 words = 512 bytes per tile
    const int64_t row = (tile / tiles_along_k) * kMxScaleTileRows + (within % 4) * 32 + within / 4;
    const int64_t first_block = (tile % tiles_along_k) * kMxScaleTileBlocks;
    uint32_t word = 0;
    for (int64_t j = 0; j < kMxScaleTileBlocks; ++j) {
      const int64_t block = first_block + j;
      const uint8_t code = row < rows && block < blocks ? scales[row * blocks + block] : kPadScale;
      word |= static_cast<uint32_t>(code) << (8 * j);  // byte j of a little-endian word
    }
    dst[w] = word;
  }
}

}  // namespace

void launch_mx_swizzle_scales(const uint8_t* scales, int64_t rows, int64_t blocks, uint8_t* dst,
                              cudaStream_t stream) {
  const int64_t words = mx_swizzled_scale_bytes(rows, blocks) / 4;
  if (words == 0) return;
  const int64_t tiles_along_k = (blocks + kMxScaleTileBlocks - 1) / kMxScaleTileBlocks;
  mx_swizzle_scales_kernel<<<elementwise_blocks(words), kElementThreads, 0, stream>>>(
      scales, rows, blocks, tiles_along_k, words, reinterpret_cast<uint32_t*>(dst));
}

}  // namespace moecore::kernels::cuda
