// Sum of squares, the plain-loop oracle: one double accumulator in index order.
#include "kernels/ops.h"

namespace moecore::kernels::reference {

double sum_of_squares(ConstTensorView values) {
  const int64_t n = values.numel();
  const float* v = values.data<float>("sum_of_squares");
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += double{v[i]} * double{v[i]};
  return total;
}

}  // namespace moecore::kernels::reference
