// The arithmetic of padded_dispatch_plan (kernels/ops.h), shared by the CPU backend, the CUDA
// kernels (nvcc compiles this header: plain pointers, integers only) and the host's rowwise plan
// (dist/rowwise_plan.cpp walks the same keep matrix), so that the padded transport keeps exactly
// the routes the window transport keeps.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/padded_dispatch_shape.h"

namespace moecore::kernels {

// The rowwise keep matrix in the order a destination's buffer fills (local expert, then source):
// for every destination dst, local expert le and source src, in that nesting, `visit(src, e,
// kept, first_row)` with e = dst * local_experts + le the global expert, kept = the first
// min(requested, room left) of src's routes to e, first_row = where they start in dst's buffer.
// requests: [ranks, E]. Returns nothing; the visitor sees everything.
template <typename Visit>
MOECORE_HOST_DEVICE inline void rowwise_keep_walk(const int64_t* requests, int64_t ranks,
                                                  int64_t local_experts, int64_t capacity,
                                                  Visit&& visit) {
  const int64_t e_count = ranks * local_experts;
  for (int64_t dst = 0; dst < ranks; ++dst) {
    int64_t filled = 0;
    for (int64_t le = 0; le < local_experts; ++le) {
      const int64_t e = dst * local_experts + le;
      for (int64_t src = 0; src < ranks; ++src) {
        const int64_t requested = requests[src * e_count + e];
        const int64_t room = capacity - filled > 0 ? capacity - filled : 0;
        const int64_t kept = requested < room ? requested : room;
        visit(src, e, kept, filled);
        filled += kept;
      }
    }
  }
}

// The serial part, for shape.rank: kept and first_row [ranks * E] (the keep matrix), send_base
// [E] (where rank's kept routes to e start inside its block to e's rank), recv_base
// [ranks * (local + 1)] (where src's rows for each of rank's local experts start inside src's
// block, and their total), expert_offsets [local + 1] (rank's buffer, expert-major) and
// *dropped (rank's routes dropped). Returns false when a pair keeps more rows than block_rows
// (the host sized the blocks too small).
MOECORE_HOST_DEVICE inline bool padded_keep(const int64_t* requests,
                                            const PaddedDispatchShape& shape, int64_t* kept,
                                            int64_t* first_row, int64_t* send_base,
                                            int64_t* recv_base, int64_t* expert_offsets,
                                            int64_t* dropped) {
  const int64_t local = shape.local_experts, e_count = shape.ranks * local, me = shape.rank;
  for (int64_t le = 0; le <= local; ++le) expert_offsets[le] = 0;
  rowwise_keep_walk(requests, shape.ranks, local, shape.capacity,
                    [&](int64_t src, int64_t e, int64_t k, int64_t first) {
                      kept[src * e_count + e] = k;
                      first_row[src * e_count + e] = first;
                      if (e / local == me) expert_offsets[e % local + 1] = first + k;
                    });
  bool fits = true;
  int64_t lost = 0;
  for (int64_t dst = 0; dst < shape.ranks; ++dst) {
    int64_t in_block = 0;
    for (int64_t le = 0; le < local; ++le) {
      const int64_t e = dst * local + le;
      send_base[e] = in_block;
      in_block += kept[me * e_count + e];
      lost += requests[me * e_count + e] - kept[me * e_count + e];
    }
    if (in_block > shape.block_rows) fits = false;
  }
  for (int64_t src = 0; src < shape.ranks; ++src) {
    int64_t in_block = 0;
    for (int64_t le = 0; le < local; ++le) {
      recv_base[src * (local + 1) + le] = in_block;
      in_block += kept[src * e_count + me * local + le];
    }
    recv_base[src * (local + 1) + local] = in_block;
    if (in_block > shape.block_rows) fits = false;
  }
  *dropped = lost;
  return fits;
}

// Route r's send slot, or -1 when the capacity dropped it. expert: its global expert; index: its
// place among this rank's routes to that expert, in token order.
MOECORE_HOST_DEVICE inline int32_t padded_route_slot(int64_t expert, int64_t index,
                                                     const PaddedDispatchShape& shape,
                                                     const int64_t* kept,
                                                     const int64_t* send_base) {
  const int64_t e_count = shape.ranks * shape.local_experts;
  if (index >= kept[shape.rank * e_count + expert]) return -1;
  const int64_t in_block = send_base[expert] + index;
  if (in_block >= shape.block_rows) return -1;  // padded_keep reported it
  return static_cast<int32_t>((expert / shape.local_experts) * shape.block_rows + in_block);
}

// The expert-major row of received slot q (source q / block_rows), or -1 for an empty slot.
MOECORE_HOST_DEVICE inline int32_t padded_slot_row(int64_t q, const PaddedDispatchShape& shape,
                                                   const int64_t* first_row,
                                                   const int64_t* recv_base) {
  const int64_t local = shape.local_experts, e_count = shape.ranks * local;
  const int64_t src = q / shape.block_rows, j = q % shape.block_rows;
  const int64_t* base = recv_base + src * (local + 1);
  for (int64_t le = 0; le < local; ++le)
    if (j < base[le + 1])
      return static_cast<int32_t>(first_row[src * e_count + shape.rank * local + le] + j -
                                  base[le]);
  return -1;
}

}  // namespace moecore::kernels
