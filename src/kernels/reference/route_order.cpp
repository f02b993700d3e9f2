// The MoE dispatch's send order, the plain-loop oracle: expert by expert, the routes in order
// (O(experts * routes), a formulation of its own beside the backends' counting sort).
#include "kernels/ops.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::reference {

void order_routes_by_expert(ConstTensorView topk_index, int64_t experts, TensorView dst_row,
                            TensorView expert_offsets) {
  constexpr const char* kOp = "order_routes_by_expert";
  const int64_t routes =
      expect_route_order_views(kOp, topk_index, experts, dst_row, expert_offsets);
  const int32_t* index = topk_index.data<int32_t>(kOp);
  int32_t* row = dst_row.data<int32_t>(kOp);
  int64_t* offsets = expert_offsets.data<int64_t>(kOp);
  expect_expert_ids(kOp, index, routes, experts);
  int64_t next = 0;
  offsets[0] = 0;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < routes; ++r)
      if (index[r] == e) row[r] = static_cast<int32_t>(next++);
    offsets[e + 1] = next;
  }
}

}  // namespace moecore::kernels::reference
