// The symmetric block exchange's arithmetic: the size of its window (which the planner counts too)
// and what one CTA of it does (dist/nccl/nccl_block_exchange.cu), the latter written
// once over the memory and barriers it is given, so that the CUDA kernel (NCCL's windows and LSA
// barriers) and the CPU test (tests/cpp/test_block_exchange_steps.cpp: threads standing for
// ranks and CTAs, arrays for the windows, std::barrier) run the same slicing, offsets and order.
// nvcc compiles this header.
//
// Memory is the interface the steps need:
//   float* peer_window(int peer)          the start of rank `peer`'s window (ranks x block floats)
//   const float* own_window()             this rank's window
//   void copy(const float* from, float* to, int64_t n)   by the CTA's threads
//   void sync_relaxed(), sync_acq_rel()   a barrier with the same CTA of every rank
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.h"

namespace moecore::dist {

// The bytes of the symmetric window that receives `ranks` blocks of `block` floats: whole 2 MiB
// granules (what ncclMemAlloc maps at least), so that a slightly larger exchange does not
// reallocate. The planner counts the same (plan/memory_model.cpp).
inline size_t symmetric_window_bytes(int64_t ranks, int64_t block) {
  constexpr size_t kGranule = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(ranks) * static_cast<size_t>(block) * sizeof(float);
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

// The floats [begin, end) of every block that CTA `cta` of `ctas` moves: the same on every rank,
// so that the barrier of a CTA pairs it with the CTAs that store into and read from the same
// floats. A multiple of 4 floats per CTA, so that the slices of 16-byte aligned blocks stay
// aligned; trailing CTAs may get nothing.
struct BlockSlice {
  int64_t begin = 0;
  int64_t end = 0;
};

MOECORE_HOST_DEVICE inline BlockSlice block_exchange_slice(int64_t block, int64_t cta,
                                                           int64_t ctas) {
  const int64_t per_cta = ((block + ctas - 1) / ctas + 3) / 4 * 4;
  const int64_t begin = cta * per_cta < block ? cta * per_cta : block;
  const int64_t end = begin + per_cta < block ? begin + per_cta : block;
  return {begin, end};
}

// One exchange by one CTA of rank `rank` of `ranks`: recv's block src = rank src's send block
// for this rank, for the CTA's slice.
template <typename Memory>
MOECORE_HOST_DEVICE inline void block_exchange_cta(Memory& memory, int rank, int ranks,
                                                   int64_t block, int64_t cta, int64_t ctas,
                                                   const float* send, float* recv) {
  const BlockSlice slice = block_exchange_slice(block, cta, ctas);
  const int64_t n = slice.end - slice.begin;
  // 1. Every rank's same CTA has ended the previous exchange, reads of its window included.
  memory.sync_relaxed();
  // 2. The slice of each destination's block into its window, at this rank's block; each rank
  //    starts at another peer, so that the links share the load.
  if (n > 0) {
    for (int k = 0; k < ranks; ++k) {
      const int peer = (rank + k) % ranks;
      memory.copy(send + static_cast<int64_t>(peer) * block + slice.begin,
                  memory.peer_window(peer) + static_cast<int64_t>(rank) * block + slice.begin, n);
    }
  }
  // 3. Every source's slice has arrived in this rank's window (release, then acquire).
  memory.sync_acq_rel();
  // 4. Out of the window into the caller's buffer.
  if (n > 0) {
    for (int source = 0; source < ranks; ++source) {
      const int64_t at = static_cast<int64_t>(source) * block + slice.begin;
      memory.copy(memory.own_window() + at, recv + at, n);
    }
  }
}

}  // namespace moecore::dist
