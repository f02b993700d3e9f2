// The MoE dispatch's send order on the GPU, in three launches and no atomics, so that the rows
// come out the same every run (and the same as the CPU's counting sort):
//   1. one block per expert scans every route in chunks of kThreads: a block-wide exclusive scan
//      of the flags "this route goes to my expert" numbers the expert's routes in route order (the
//      stable order) from 0 into dst_row, and the expert's count lands in expert_offsets[e + 1];
//   2. one block scans the counts in place into expert_offsets (chunks of kThreads, a carry
//      between them), offsets[0] = 0;
//   3. a grid-stride pass adds each route's expert offset to its dst_row, or writes -1 for an id
//      outside [0, experts) (counted in no expert: nothing waits to check the ids).
// Step 1 reads all routes once per expert: O(experts * routes) reads, from L2 at a dispatch's
// sizes (a few hundred experts, some hundred thousand routes).
#include <cstdint>

#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // a multiple of 32, at most 32 warps
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxExpertBlocks = 65535;  // more experts loop within the blocks
constexpr unsigned int kFullMask = 0xffffffffu;

// The exclusive prefix sum of v over the block (in thread order) and, in *total, the block's sum,
// in every thread. warp_sums: kWarps entries of shared memory. Every thread of the block calls it
// (it has barriers); the last one lets the next call reuse warp_sums.
__device__ long long block_exclusive_scan(long long v, long long* warp_sums, long long* total) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  long long inclusive = v;
  for (int offset = 1; offset < 32; offset *= 2) {
    const long long below = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    // The warps' totals, scanned inclusively by the first warp (each lane reads and writes its own
    // entry only).
    long long sum = lane < kWarps ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset *= 2) {
      const long long below = __shfl_up_sync(kFullMask, sum, offset);
      if (lane >= offset) sum += below;
    }
    if (lane < kWarps) warp_sums[lane] = sum;
  }
  __syncthreads();
  const long long before = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[kWarps - 1];
  __syncthreads();
  return before + inclusive - v;
}

// dst_row[r] = the place of route r among its expert's routes; expert_offsets[e + 1] = the
// expert's count. Routes of other experts (and ids out of range) are left alone.
__global__ void number_expert_routes_kernel(const int32_t* topk_index, int64_t routes,
                                            int64_t experts, int32_t* dst_row,
                                            int64_t* expert_offsets) {
  __shared__ long long warp_sums[kWarps];
  for (int64_t e = blockIdx.x; e < experts; e += gridDim.x) {
    long long placed = 0;  // the same in every thread
    for (int64_t first = 0; first < routes; first += kThreads) {
      const int64_t r = first + threadIdx.x;
      const bool mine = r < routes && topk_index[r] == e;
      long long chunk = 0;
      const long long place = block_exclusive_scan(mine ? 1 : 0, warp_sums, &chunk);
      if (mine) dst_row[r] = static_cast<int32_t>(placed + place);
      placed += chunk;
    }
    if (threadIdx.x == 0) expert_offsets[e + 1] = placed;
  }
}

// expert_offsets[1 .. experts] hold the counts: in place, their inclusive prefix sums, and
// expert_offsets[0] = 0. One block.
__global__ void scan_expert_counts_kernel(int64_t experts, int64_t* expert_offsets) {
  __shared__ long long warp_sums[kWarps];
  long long carry = 0;  // the same in every thread
  for (int64_t first = 0; first < experts; first += kThreads) {
    const int64_t e = first + threadIdx.x;
    // Read before the scan's barriers, written after them: no thread reads an entry another
    // writes in the same chunk, and chunks do not overlap.
    const long long count = e < experts ? expert_offsets[e + 1] : 0;
    long long chunk = 0;
    const long long before = block_exclusive_scan(count, warp_sums, &chunk);
    if (e < experts) expert_offsets[e + 1] = carry + before + count;
    carry += chunk;
  }
  if (threadIdx.x == 0) expert_offsets[0] = 0;
}

__global__ void add_expert_offsets_kernel(const int32_t* topk_index, int64_t routes,
                                          int64_t experts, const int64_t* expert_offsets,
                                          int32_t* dst_row) {
  for (int64_t r = grid_first(); r < routes; r += grid_stride()) {
    const int32_t e = topk_index[r];
    dst_row[r] = e >= 0 && e < experts ? static_cast<int32_t>(expert_offsets[e] + dst_row[r]) : -1;
  }
}

}  // namespace

void launch_order_routes_by_expert(const int32_t* topk_index, int64_t routes, int64_t experts,
                                   int32_t* dst_row, int64_t* expert_offsets, cudaStream_t stream) {
  if (experts <= 0) return;
  const auto expert_blocks =
      static_cast<unsigned int>(experts < kMaxExpertBlocks ? experts : kMaxExpertBlocks);
  number_expert_routes_kernel<<<expert_blocks, kThreads, 0, stream>>>(topk_index, routes, experts,
                                                                      dst_row, expert_offsets);
  scan_expert_counts_kernel<<<1, kThreads, 0, stream>>>(experts, expert_offsets);
  if (routes > 0)
    add_expert_offsets_kernel<<<elementwise_blocks(routes), kElementThreads, 0, stream>>>(
        topk_index, routes, experts, expert_offsets, dst_row);
}

}  // namespace moecore::kernels::cuda
