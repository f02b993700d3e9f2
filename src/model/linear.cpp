#include "model/linear.h"

#include "kernels/ops.h"

namespace moecore {

namespace {

void forward(GemmOperands operands, const float* x, const float* w, float* y, int64_t rows,
             int64_t in, int64_t out) {
  kernels::matmul(view(x, {rows, in}), false, view(w, {out, in}), true, 1.0f, 0.0f,
                  view(y, {rows, out}), operands);
}

void backward(GemmOperands operands, const float* dy, const float* x, const float* w, float* dx,
              float* dw, int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  if (dx != nullptr)
    kernels::matmul(view(dy, {rows, out}), false, view(w, {out, in}), false, 1.0f,
                    accumulate_dx ? 1.0f : 0.0f, view(dx, {rows, in}), operands);
  kernels::matmul(view(dy, {rows, out}), true, view(x, {rows, in}), false, 1.0f, 1.0f,
                  view(dw, {out, in}), operands);
}

}  // namespace

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out) {
  forward(GemmOperands::kModelPrecision, x, w, y, rows, in, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  backward(GemmOperands::kModelPrecision, dy, x, w, dx, dw, rows, in, out, accumulate_dx);
}

void linear_forward_fp32(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                         int64_t out) {
  forward(GemmOperands::kFp32, x, w, y, rows, in, out);
}

void linear_backward_fp32(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  backward(GemmOperands::kFp32, dy, x, w, dx, dw, rows, in, out, accumulate_dx);
}

}  // namespace moecore
