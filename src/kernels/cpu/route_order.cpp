// The MoE dispatch's send order on the CPU (model/local_dispatch.cpp and sync_dispatch.cpp call
// it): a counting sort, serial (O(routes + experts), a few microseconds per layer).
#include "kernels/cpu/ops.h"
#include "kernels/router_checks.h"

namespace moecore::kernels::cpu {

void order_routes_by_expert(ConstTensorView topk_index, int64_t experts, TensorView dst_row,
                            TensorView expert_offsets) {
  constexpr const char* kOp = "order_routes_by_expert";
  const int64_t routes =
      expect_route_order_views(kOp, topk_index, experts, dst_row, expert_offsets);
  const int32_t* index = topk_index.data<int32_t>(kOp);
  int32_t* row = dst_row.data<int32_t>(kOp);
  int64_t* offsets = expert_offsets.data<int64_t>(kOp);
  // Every id is checked before anything is written.
  expect_expert_ids(kOp, index, routes, experts);
  // Expert e's count in offsets[e], then its start.
  for (int64_t e = 0; e <= experts; ++e) offsets[e] = 0;
  for (int64_t r = 0; r < routes; ++r) ++offsets[index[r]];
  int64_t start = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t count = offsets[e];
    offsets[e] = start;
    start += count;
  }
  offsets[experts] = start;
  // offsets[e] is expert e's cursor: it ends at e's end, the start of e + 1, which moves up one
  // place (no buffer of cursors: nothing allocates per call).
  for (int64_t r = 0; r < routes; ++r) row[r] = static_cast<int32_t>(offsets[index[r]]++);
  for (int64_t e = experts - 1; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

}  // namespace moecore::kernels::cpu
