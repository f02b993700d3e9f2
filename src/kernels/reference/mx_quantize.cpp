// MX quantisation, the plain-loop oracle: each block of 32 values read with a stride (1 along a
// row, cols down a column), its scale from amax by mx::block_scale_code and each element encoded
// by mx::encode_elem after one fp32 multiply by 1 / X, the rules core/mx_types.h states.
#include <cmath>
#include <limits>

#include "kernels/mx_checks.h"
#include "kernels/ops.h"

namespace moecore::kernels::reference {

namespace {

// One block: values v[0], v[stride], ... v[31 * stride] -> 32 consecutive codes and one scale.
void quantize_block(mx::ElemType elem, mx::ScaleMode mode, const float* v, int64_t stride,
                    uint8_t* codes, uint8_t* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < mx::kMxBlock; ++i) {
    const float a = std::fabs(v[i * stride]);
    if (std::isnan(a)) {
      amax = std::numeric_limits<float>::quiet_NaN();
      break;
    }
    if (a > amax) amax = a;
  }
  *scale = mx::block_scale_code(elem, mode, amax);
  const float inverse_scale = std::ldexp(1.0f, mx::kE8m0Bias - static_cast<int>(*scale));
  for (int64_t i = 0; i < mx::kMxBlock; ++i)
    codes[i] = mx::encode_elem(elem, v[i * stride] * inverse_scale);
}

}  // namespace

void mx_quantize(ConstTensorView x, mx::ScaleMode mode, TensorView codes, TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize", x, codes, scales, false);
  const int64_t rows = q.x.batch * q.x.rows, cols = q.x.cols, blocks = cols / mx::kMxBlock;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      quantize_block(q.elem, mode, q.values + r * cols + b * mx::kMxBlock, 1,
                     q.codes + r * cols + b * mx::kMxBlock, q.scales + r * blocks + b);
}

void mx_quantize_transposed(ConstTensorView x, mx::ScaleMode mode, TensorView codes,
                            TensorView scales) {
  const MxQuantizeArgs q = mx_quantize_args("mx_quantize_transposed", x, codes, scales, true);
  const int64_t rows = q.x.rows, cols = q.x.cols, blocks = rows / mx::kMxBlock;
  for (int64_t m = 0; m < q.x.batch; ++m)
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t out_row = m * cols + c;  // column c of matrix m, a row of the output
        quantize_block(q.elem, mode, q.values + (m * rows + b * mx::kMxBlock) * cols + c, cols,
                       q.codes + out_row * rows + b * mx::kMxBlock,
                       q.scales + out_row * blocks + b);
      }
}

}  // namespace moecore::kernels::reference
