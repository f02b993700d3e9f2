// MX quantisation on the CPU. Along the last dimension it is mx::quantize (core/mx_types.h), rows
// in parallel. The transposed orientation reads x in tiles of 32 rows x 64 columns (32 runs of 256
// contiguous bytes), transposes each tile into a small buffer and quantises its 64 columns as rows
// with the same routine, so every element goes through the same rounding code as mx_quantize and
// x^T is never materialised.
#include <algorithm>
#include <cstring>

#include "kernels/mx_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels {

namespace {

constexpr int64_t kTileCols = 64;  // columns of x per transposed tile (one 256-byte run per row)

}  // namespace

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize", x, codes, scales, false);
  mx::quantize(q.elem, mode, q.x.batch * q.x.rows, q.x.cols, q.values, q.x.cols, q.codes, q.scales);
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize_transposed", x, codes, scales, true);
  const int64_t rows = q.x.rows, cols = q.x.cols;
  const int64_t row_blocks = rows / mx::kMxBlock;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
#pragma omp parallel for collapse(3) \
    schedule(static) if (q.x.batch * rows * cols >= (int64_t{1} << 16))
  for (int64_t b = 0; b < q.x.batch; ++b) {
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      for (int64_t t = 0; t < col_tiles; ++t) {
        const int64_t c0 = t * kTileCols, width = std::min(kTileCols, cols - c0);
        const float* src = q.values + (b * rows + rb * mx::kMxBlock) * cols + c0;
        float tile[kTileCols * mx::kMxBlock];  // [column][row of the block]
        for (int64_t i = 0; i < mx::kMxBlock; ++i)
          for (int64_t c = 0; c < width; ++c) tile[c * mx::kMxBlock + i] = src[i * cols + c];
        uint8_t tile_codes[kTileCols * mx::kMxBlock];
        uint8_t tile_scales[kTileCols];
        mx::quantize(q.elem, mode, width, mx::kMxBlock, tile, mx::kMxBlock, tile_codes,
                     tile_scales);
        for (int64_t c = 0; c < width; ++c) {
          const int64_t column = b * cols + c0 + c;  // row of the transposed output
          std::memcpy(q.codes + column * rows + rb * mx::kMxBlock, tile_codes + c * mx::kMxBlock,
                      mx::kMxBlock);
          q.scales[column * row_blocks + rb] = tile_scales[c];
        }
      }
    }
  }
}

}  // namespace moecore::kernels
