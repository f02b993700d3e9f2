// RMSNorm, the plain-loop oracle: one row at a time, statistics in double.
#include <cmath>

#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

void rmsnorm_forward(ConstTensorView x, ConstTensorView w, TensorView y, TensorView rstd,
                     float eps) {
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape("rmsnorm", "y", y, {rows, dim});
  const float* xp = x.data<float>("rmsnorm");
  const float* wp = w.data<float>("rmsnorm");
  float* yp = y.data<float>("rmsnorm");
  float* rp = rstd.data<float>("rmsnorm");
  for (int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0.0;
    for (int64_t j = 0; j < dim; ++j) sum_sq += double{xp[r * dim + j]} * double{xp[r * dim + j]};
    const double s = 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + double{eps});
    rp[r] = static_cast<float>(s);
    for (int64_t j = 0; j < dim; ++j)
      yp[r * dim + j] = static_cast<float>(double{wp[j]} * (double{xp[r * dim + j]} * s));
  }
}

// dx = s (dy w - xhat mean(dy w xhat)) with xhat = x s; dw += sum over rows of dy xhat.
void rmsnorm_backward(ConstTensorView dy, ConstTensorView x, ConstTensorView w,
                      ConstTensorView rstd, TensorView dx, TensorView dw, bool accumulate_dx) {
  const int64_t rows = x.size(0), dim = x.size(1);
  expect_shape("rmsnorm_backward", "dx", dx, {rows, dim});
  const float* dyp = dy.data<float>("rmsnorm_backward");
  const float* xp = x.data<float>("rmsnorm_backward");
  const float* wp = w.data<float>("rmsnorm_backward");
  const float* rp = rstd.data<float>("rmsnorm_backward");
  float* dxp = dx.data<float>("rmsnorm_backward");
  float* dwp = dw.data<float>("rmsnorm_backward");
  for (int64_t r = 0; r < rows; ++r) {
    const double s = double{rp[r]};
    double dot = 0.0;
    for (int64_t j = 0; j < dim; ++j)
      dot += double{dyp[r * dim + j]} * double{wp[j]} * (double{xp[r * dim + j]} * s);
    const double mean_dot = dot / static_cast<double>(dim);
    for (int64_t j = 0; j < dim; ++j) {
      const double xhat = double{xp[r * dim + j]} * s;
      dwp[j] = static_cast<float>(double{dwp[j]} + double{dyp[r * dim + j]} * xhat);
      const double g = s * (double{dyp[r * dim + j]} * double{wp[j]} - xhat * mean_dot);
      float& out = dxp[r * dim + j];
      out = accumulate_dx ? static_cast<float>(double{out} + g) : static_cast<float>(g);
    }
  }
}

}  // namespace moecore::kernels::reference
