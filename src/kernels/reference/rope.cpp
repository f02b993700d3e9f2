// RoPE, the plain-loop oracle: each pair (i, i + head_dim/2) rotated by sign * angle in double.
#include "kernels/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::reference {

namespace {

void rotate(const char* op, TensorView x, ConstTensorView cos, ConstTensorView sin,
            int64_t first_position, double sign) {
  const int64_t batch = x.size(0), seq = x.size(1), heads = x.size(2), half = x.size(3) / 2;
  MOE_CHECK(first_position + seq <= cos.size(0), "[{}] positions exceed the table", op);
  float* xp = x.data<float>(op);
  const float* cp = cos.data<float>(op);
  const float* sp = sin.data<float>(op);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          float* lo = xp + ((b * seq + t) * heads + h) * 2 * half + i;
          float* hi = lo + half;
          const double c = double{cp[(first_position + t) * half + i]};
          const double s = sign * double{sp[(first_position + t) * half + i]};
          const double x_lo = double{*lo}, x_hi = double{*hi};
          *lo = static_cast<float>(x_lo * c - x_hi * s);
          *hi = static_cast<float>(x_hi * c + x_lo * s);
        }
}

}  // namespace

void rope_forward(TensorView x, ConstTensorView cos, ConstTensorView sin, int64_t first_position) {
  rotate("rope", x, cos, sin, first_position, 1.0);
}

void rope_backward(TensorView dx, ConstTensorView cos, ConstTensorView sin,
                   int64_t first_position) {
  rotate("rope_backward", dx, cos, sin, first_position, -1.0);
}

}  // namespace moecore::kernels::reference
