#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace moecore {

std::array<double, 2> sums_of_squares(std::span<const float> first, std::span<const float> second,
                                      Workspace& scratch) {
  Workspace::Scope scope(scratch);
  const std::span<double> totals = scope.uninitialized<double>(2);
  kernels::sum_of_squares(view(first.data(), {static_cast<int64_t>(first.size())}),
                          view(totals.data(), {1}));
  kernels::sum_of_squares(view(second.data(), {static_cast<int64_t>(second.size())}),
                          view(totals.data() + 1, {1}));
  std::array<double, 2> on_host{};
  copy_bytes(on_host.data(), totals.data(), sizeof(on_host));
  return on_host;
}

float clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

double global_grad_norm(const ParamBuffers& grads) {
  Workspace scratch;
  const std::array<double, 2> squares =
      sums_of_squares({grads.dense.data(), grads.dense.size()},
                      {grads.expert.data(), grads.expert.size()}, scratch);
  return std::sqrt(squares[0] + squares[1]);
}

double clip_grad_norm(ParamBuffers& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  const float coef = clip_coefficient(max_norm, norm);
  if (coef < 1.0f) {
    for (DeviceArray<float>* group : {&grads.dense, &grads.expert}) {
      const int64_t count = static_cast<int64_t>(group->size());
      kernels::scale(view(group->data(), {count}), coef, view(group->data(), {count}));
    }
  }
  return norm;
}

}  // namespace moecore
