// The kernel of NcclBlockExchange (nccl_block_exchange.h says what each step guarantees).
#include <nccl_device.h>

#include <cstdint>

#include "dist/nccl/nccl_block_exchange.h"

namespace moecore::dist {

namespace {

constexpr int kThreads = 512;

// n floats from `from` to `to` by the CTA's threads, 16 bytes at a time where both are aligned
// (the blocks are rows of the hidden size, a multiple of 4 floats in every model here).
__device__ void copy_floats(const float* from, float* to, int64_t n) {
  const bool vectors = n % 4 == 0 && reinterpret_cast<uintptr_t>(from) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(to) % 16 == 0;
  if (vectors) {
    const float4* from4 = reinterpret_cast<const float4*>(from);
    float4* to4 = reinterpret_cast<float4*>(to);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) to4[i] = from4[i];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
  }
}

__global__ void __launch_bounds__(kThreads)
    block_exchange_kernel(ncclDevComm comm, ncclWindow_t window, const float* send, float* recv,
                          int64_t block) {
  ncclLsaBarrierSession<ncclCoopCta> barrier{ncclCoopCta(), comm, ncclTeamLsa(comm),
                                             comm.lsaBarrier, blockIdx.x};
  // This CTA's slice of every block, the same on every rank: a multiple of 4 floats, so that the
  // slices of aligned blocks stay aligned.
  const int64_t per_cta = ((block + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
  const int64_t begin = blockIdx.x * per_cta;
  const int64_t end = begin + per_cta < block ? begin + per_cta : block;
  const int rank = comm.lsaRank, ranks = comm.lsaSize;
  // 1. Nobody still reads its window's slice from the previous exchange.
  barrier.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  // 2. The slice of each destination's block into its window, at this rank's block.
  if (begin < end) {
    const size_t at = (static_cast<size_t>(rank) * block + begin) * sizeof(float);
    for (int k = 0; k < ranks; ++k) {
      const int peer = (rank + k) % ranks;  // each rank starts at another peer: links share load
      float* to = static_cast<float*>(ncclGetLsaPointer(window, at, peer));
      copy_floats(send + static_cast<int64_t>(peer) * block + begin, to, end - begin);
    }
  }
  // 3. Every source's slice has arrived in this rank's window.
  barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  // 4. Out of the window into the caller's buffer.
  if (begin < end) {
    const float* mine = static_cast<const float*>(ncclGetLocalPointer(window, 0));
    for (int source = 0; source < ranks; ++source) {
      const int64_t at = static_cast<int64_t>(source) * block + begin;
      copy_floats(mine + at, recv + at, end - begin);
    }
  }
}

}  // namespace

void launch_block_exchange(const ncclDevComm& comm, ncclWindow_t window, const float* send,
                           float* recv, int64_t block, cudaStream_t stream) {
  block_exchange_kernel<<<NcclBlockExchange::kCtas, kThreads, 0, stream>>>(comm, window, send, recv,
                                                                           block);
}

}  // namespace moecore::dist
