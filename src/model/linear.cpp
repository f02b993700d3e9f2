#include "model/linear.h"

#include "kernels/gemm.h"

namespace moecore {

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out) {
  kernels::gemm(false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx != nullptr)
    kernels::gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f,
                  dx, in);
  kernels::gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

}  // namespace moecore
