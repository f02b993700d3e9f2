// Sum of squares, the plain-loop oracle: one double accumulator in index order.
#include "kernels/ops.h"

namespace moecore::kernels::reference {

void sum_of_squares(ConstTensorView values, TensorView total) {
  const int64_t n = values.numel();
  const float* v = values.data<float>("sum_of_squares");
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{v[i]} * double{v[i]};
  *total.data<double>("sum_of_squares") = sum;
}

}  // namespace moecore::kernels::reference
