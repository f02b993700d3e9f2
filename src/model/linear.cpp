#include "model/linear.h"

#include "kernels/gemm.h"

namespace moecore {

namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);

void forward(GemmFn gemm, const float* x, const float* w, float* y, int64_t rows, int64_t in,
             int64_t out) {
  gemm(false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void backward(GemmFn gemm, const float* dy, const float* x, const float* w, float* dx, float* dw,
              int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx != nullptr)
    gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

}  // namespace

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out) {
  forward(kernels::gemm, x, w, y, rows, in, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  backward(kernels::gemm, dy, x, w, dx, dw, rows, in, out, accumulate_dx);
}

void linear_forward_fp32(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                         int64_t out) {
  forward(kernels::gemm_fp32, x, w, y, rows, in, out);
}

void linear_backward_fp32(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  backward(kernels::gemm_fp32, dy, x, w, dx, dw, rows, in, out, accumulate_dx);
}

}  // namespace moecore
