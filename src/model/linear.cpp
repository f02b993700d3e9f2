#include "model/linear.h"

#include "kernels/ops.h"

namespace moecore {

void linear_forward(kernels::MatmulPrecision precision, const float* x, ConstTensorView w, float* y,
                    int64_t rows, int64_t in, int64_t out) {
  kernels::matmul(view(x, {rows, in}), false, w, true, 1.0f, 0.0f, view(y, {rows, out}), precision);
}

void linear_backward(kernels::MatmulPrecision precision, const float* dy, const float* x,
                     ConstTensorView w, float* dx, float* dw, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx) {
  if (dx != nullptr)
    kernels::matmul(view(dy, {rows, out}), false, w, false, 1.0f, accumulate_dx ? 1.0f : 0.0f,
                    view(dx, {rows, in}), precision);
  kernels::matmul(view(dy, {rows, out}), true, view(x, {rows, in}), false, 1.0f, 1.0f,
                  view(dw, {out, in}), precision);
}

}  // namespace moecore
