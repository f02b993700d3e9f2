// The padded all-to-all's index maps on the GPU (kernels/padded_dispatch_rules.h, the CPU
// backend's rules): the keep matrix in one thread (ranks x E values), then one thread per route
// and per received slot. Nothing here waits for the host, and the host reads none of it.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/padded_dispatch_rules.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void padded_keep_kernel(const int64_t* requests, PaddedDispatchShape shape,
                                   PaddedDispatchScratch scratch, int64_t* expert_offsets,
                                   int64_t* dropped) {
  padded_keep(requests, shape, scratch.kept, scratch.first_row, scratch.send_base,
              scratch.recv_base, expert_offsets, dropped);
}

__global__ void fill_kernel(int32_t* values, int64_t count, int32_t value) {
  for (int64_t i = grid_first(); i < count; i += grid_stride()) values[i] = value;
}

__global__ void route_slot_kernel(const int32_t* topk, const int32_t* order, const int64_t* starts,
                                  int64_t routes, int64_t top_k, PaddedDispatchShape shape,
                                  PaddedDispatchScratch scratch, int32_t* slot_of_position,
                                  int32_t* position_of_slot, int32_t* token_of_slot) {
  const int64_t experts = shape.ranks * shape.local_experts;
  for (int64_t r = grid_first(); r < routes; r += grid_stride()) {
    const int64_t e = topk[r];
    // An id outside the experts has no position (order_routes_by_expert gave it -1; nothing is
    // checked here) and travels nowhere, as a route the capacity dropped.
    const int32_t position = order[r];
    if (e < 0 || e >= experts || position < 0) continue;
    const int32_t slot =
        padded_route_slot(e, position - starts[e], shape, scratch.kept, scratch.send_base);
    slot_of_position[position] = slot;
    if (slot < 0) continue;
    position_of_slot[slot] = position;
    token_of_slot[slot] = static_cast<int32_t>(r / top_k);
  }
}

__global__ void slot_row_kernel(PaddedDispatchShape shape, PaddedDispatchScratch scratch,
                                int32_t* row_of_slot, int32_t* slot_of_row) {
  const int64_t slots = shape.ranks * shape.block_rows;
  for (int64_t q = grid_first(); q < slots; q += grid_stride()) {
    const int32_t row = padded_slot_row(q, shape, scratch.first_row, scratch.recv_base);
    row_of_slot[q] = row;
    if (row >= 0 && row < shape.capacity) slot_of_row[row] = static_cast<int32_t>(q);
  }
}

}  // namespace

void launch_padded_dispatch_plan(const int64_t* requests, const int32_t* topk_index,
                                 const int32_t* route_order, const int64_t* expert_starts,
                                 int64_t tokens, int64_t top_k, const PaddedDispatchShape& shape,
                                 const PaddedDispatchScratch& scratch, int32_t* slot_of_position,
                                 int32_t* position_of_slot, int32_t* token_of_slot,
                                 int32_t* row_of_slot, int32_t* slot_of_row,
                                 int64_t* expert_offsets, int64_t* dropped, cudaStream_t stream) {
  const int64_t routes = tokens * top_k, slots = shape.ranks * shape.block_rows;
  padded_keep_kernel<<<1, 1, 0, stream>>>(requests, shape, scratch, expert_offsets, dropped);
  if (slots > 0) {
    fill_kernel<<<elementwise_blocks(slots), kElementThreads, 0, stream>>>(position_of_slot, slots,
                                                                           -1);
    fill_kernel<<<elementwise_blocks(slots), kElementThreads, 0, stream>>>(token_of_slot, slots,
                                                                           -1);
  }
  if (shape.capacity > 0)
    fill_kernel<<<elementwise_blocks(shape.capacity), kElementThreads, 0, stream>>>(
        slot_of_row, shape.capacity, -1);
  if (routes > 0) {
    fill_kernel<<<elementwise_blocks(routes), kElementThreads, 0, stream>>>(slot_of_position,
                                                                            routes, -1);
    route_slot_kernel<<<elementwise_blocks(routes), kElementThreads, 0, stream>>>(
        topk_index, route_order, expert_starts, routes, top_k, shape, scratch, slot_of_position,
        position_of_slot, token_of_slot);
  }
  if (slots > 0)
    slot_row_kernel<<<elementwise_blocks(slots), kElementThreads, 0, stream>>>(
        shape, scratch, row_of_slot, slot_of_row);
}

}  // namespace moecore::kernels::cuda
