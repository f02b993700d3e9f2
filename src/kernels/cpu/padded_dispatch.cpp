// The padded all-to-all's index maps on the CPU: the shared rules (kernels/padded_dispatch_rules.h,
// the CUDA kernels' too), the keep matrix in one pass and the maps over the routes and slots.
#include <algorithm>
#include <vector>

#include "core/to_size.h"
#include "kernels/cpu/ops.h"
#include "kernels/padded_dispatch_checks.h"
#include "kernels/padded_dispatch_rules.h"

namespace moecore::kernels::cpu {

void padded_dispatch_plan(ConstTensorView requests, ConstTensorView topk_index,
                          ConstTensorView route_order, ConstTensorView expert_starts,
                          const PaddedDispatchShape& shape, const PaddedDispatchMaps& maps) {
  constexpr const char* kOp = "padded_dispatch_plan";
  const PaddedDispatchDims d =
      padded_dispatch_dims(kOp, requests, topk_index, route_order, expert_starts, shape, maps);
  check_equal_routes(kOp, requests.data<int64_t>(kOp), shape.ranks, d.experts, d.tokens * d.top_k);
  const int64_t local = shape.local_experts, routes = d.tokens * d.top_k;
  std::vector<int64_t> kept(to_size(shape.ranks * d.experts)), first_row(kept.size());
  std::vector<int64_t> send_base(to_size(d.experts)), recv_base(to_size(shape.ranks * (local + 1)));
  const bool fits = padded_keep(
      requests.data<int64_t>(kOp), shape, kept.data(), first_row.data(), send_base.data(),
      recv_base.data(), maps.expert_offsets.data<int64_t>(kOp), maps.dropped.data<int64_t>(kOp));
  MOE_CHECK(fits,
            "[{}] a pair of ranks keeps more rows than the {} of its block (block_rows must be at "
            "least min(capacity, the routes of any rank))",
            kOp, shape.block_rows);

  const int32_t* topk = topk_index.data<int32_t>(kOp);
  const int32_t* order = route_order.data<int32_t>(kOp);
  const int64_t* starts = expert_starts.data<int64_t>(kOp);
  int32_t* slot_of_position = maps.slot_of_position.data<int32_t>(kOp);
  int32_t* position_of_slot = maps.position_of_slot.data<int32_t>(kOp);
  int32_t* token_of_slot = maps.token_of_slot.data<int32_t>(kOp);
  std::fill_n(position_of_slot, d.slots, -1);
  std::fill_n(token_of_slot, d.slots, -1);
  for (int64_t r = 0; r < routes; ++r) {
    const int64_t e = topk[r];
    MOE_CHECK(e >= 0 && e < d.experts, "[{}] topk_index[{}]={} is outside [0, {})", kOp, r, e,
              d.experts);
    const int32_t position = order[r];
    const int32_t slot =
        padded_route_slot(e, position - starts[e], shape, kept.data(), send_base.data());
    slot_of_position[position] = slot;
    if (slot < 0) continue;
    position_of_slot[slot] = position;
    token_of_slot[slot] = static_cast<int32_t>(r / d.top_k);
  }

  int32_t* row_of_slot = maps.row_of_slot.data<int32_t>(kOp);
  int32_t* slot_of_row = maps.slot_of_row.data<int32_t>(kOp);
  std::fill_n(slot_of_row, shape.capacity, -1);
  for (int64_t q = 0; q < d.slots; ++q) {
    const int32_t row = padded_slot_row(q, shape, first_row.data(), recv_base.data());
    row_of_slot[q] = row;
    if (row >= 0) slot_of_row[row] = static_cast<int32_t>(q);
  }
}

}  // namespace moecore::kernels::cpu
