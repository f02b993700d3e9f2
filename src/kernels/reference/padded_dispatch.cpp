// The padded all-to-all's index maps, the plain-loop oracle, written apart from the shared rules
// (kernels/padded_dispatch_rules.h) that the backends run: the keep matrix straight from its
// definition (dist/rowwise_plan.h), each route's place among its expert's routes by counting in
// route order and its position from this rank's requests (neither from route_order nor from
// expert_starts), and each received slot's row by walking the source's block.
#include <algorithm>
#include <vector>

#include "core/to_size.h"
#include "kernels/ops.h"
#include "kernels/padded_dispatch_checks.h"

namespace moecore::kernels::reference {

void padded_dispatch_plan(ConstTensorView requests, ConstTensorView topk_index,
                          ConstTensorView route_order, ConstTensorView expert_starts,
                          const PaddedDispatchShape& shape, const PaddedDispatchMaps& maps) {
  constexpr const char* kOp = "padded_dispatch_plan";
  const PaddedDispatchDims d =
      padded_dispatch_dims(kOp, requests, topk_index, route_order, expert_starts, shape, maps);
  check_equal_routes(kOp, requests.data<int64_t>(kOp), shape.ranks, d.experts, d.tokens * d.top_k);
  const int64_t ranks = shape.ranks, local = shape.local_experts, e_count = d.experts;
  const int64_t me = shape.rank, block = shape.block_rows, routes = d.tokens * d.top_k;
  const int64_t* req = requests.data<int64_t>(kOp);
  // kept[src][e] and first[src][e]: each destination fills its buffer expert by expert, source by
  // source, up to the capacity.
  std::vector<std::vector<int64_t>> kept(to_size(ranks), std::vector<int64_t>(to_size(e_count)));
  std::vector<std::vector<int64_t>> first = kept;
  int64_t* offsets = maps.expert_offsets.data<int64_t>(kOp);
  offsets[0] = 0;
  for (int64_t dst = 0; dst < ranks; ++dst) {
    int64_t filled = 0;
    for (int64_t le = 0; le < local; ++le) {
      const int64_t e = dst * local + le;
      for (int64_t src = 0; src < ranks; ++src) {
        const int64_t take = std::min(req[src * e_count + e], shape.capacity - filled);
        first[to_size(src)][to_size(e)] = filled;
        kept[to_size(src)][to_size(e)] = std::max<int64_t>(take, 0);
        filled += kept[to_size(src)][to_size(e)];
      }
      if (dst == me) offsets[le + 1] = filled;
    }
  }
  int64_t dropped = 0;
  for (int64_t e = 0; e < e_count; ++e)
    dropped += req[me * e_count + e] - kept[to_size(me)][to_size(e)];
  maps.dropped.data<int64_t>(kOp)[0] = dropped;

  // The send side: route r is the seen[e]-th of its expert's routes, at position (in the send
  // order: by expert, token order within) before[e] + seen[e].
  const int32_t* topk = topk_index.data<int32_t>(kOp);
  int32_t* slot_of_position = maps.slot_of_position.data<int32_t>(kOp);
  int32_t* position_of_slot = maps.position_of_slot.data<int32_t>(kOp);
  int32_t* token_of_slot = maps.token_of_slot.data<int32_t>(kOp);
  std::fill_n(position_of_slot, d.slots, -1);
  std::fill_n(token_of_slot, d.slots, -1);
  std::vector<int64_t> seen(to_size(e_count), 0), before(to_size(e_count), 0);
  for (int64_t e = 1; e < e_count; ++e)
    before[to_size(e)] = before[to_size(e - 1)] + req[me * e_count + e - 1];
  for (int64_t r = 0; r < routes; ++r) {
    const int64_t e = topk[r];
    MOE_CHECK(e >= 0 && e < e_count, "[{}] topk_index[{}]={} is outside [0, {})", kOp, r, e,
              e_count);
    const int64_t i = seen[to_size(e)]++;
    const int64_t position = before[to_size(e)] + i;
    slot_of_position[position] = -1;
    if (i >= kept[to_size(me)][to_size(e)]) continue;
    const int64_t dst = e / local;
    int64_t in_block = i;  // after the kept routes to dst's earlier experts
    for (int64_t earlier = dst * local; earlier < e; ++earlier)
      in_block += kept[to_size(me)][to_size(earlier)];
    MOE_CHECK(in_block < block, "[{}] a pair of ranks keeps more rows than the {} of its block",
              kOp, block);
    const int64_t slot = dst * block + in_block;
    slot_of_position[position] = static_cast<int32_t>(slot);
    position_of_slot[slot] = static_cast<int32_t>(position);
    token_of_slot[slot] = static_cast<int32_t>(r / d.top_k);
  }

  // The receive side: source src's block holds its kept routes to my experts, expert by expert.
  int32_t* row_of_slot = maps.row_of_slot.data<int32_t>(kOp);
  int32_t* slot_of_row = maps.slot_of_row.data<int32_t>(kOp);
  std::fill_n(row_of_slot, d.slots, -1);
  std::fill_n(slot_of_row, shape.capacity, -1);
  for (int64_t src = 0; src < ranks; ++src) {
    int64_t j = 0;
    for (int64_t le = 0; le < local; ++le) {
      const int64_t e = me * local + le;
      for (int64_t i = 0; i < kept[to_size(src)][to_size(e)]; ++i, ++j) {
        MOE_CHECK(j < block, "[{}] a pair of ranks keeps more rows than the {} of its block", kOp,
                  block);
        const int64_t row = first[to_size(src)][to_size(e)] + i;
        row_of_slot[src * block + j] = static_cast<int32_t>(row);
        slot_of_row[row] = static_cast<int32_t>(src * block + j);
      }
    }
  }
}

}  // namespace moecore::kernels::reference
