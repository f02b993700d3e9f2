// The kernel of NcclBlockExchange (nccl_block_exchange.h says what each step guarantees).
#include <nccl_device.h>

#include <cstdint>

#include "dist/block_exchange_steps.h"
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

// block_exchange_steps.h's Memory over NCCL's window and LSA barrier of this CTA.
class LsaMemory {
 public:
  __device__ LsaMemory(const ncclDevComm& comm, ncclWindow_t window)
      : window_(window),
        barrier_(ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x) {}

  __device__ float* peer_window(int peer) const {
    return static_cast<float*>(ncclGetLsaPointer(window_, 0, peer));
  }
  __device__ const float* own_window() const {
    return static_cast<const float*>(ncclGetLocalPointer(window_, 0));
  }
  __device__ void copy(const float* from, float* to, int64_t n) const { copy_floats(from, to, n); }
  __device__ void sync_relaxed() { barrier_.sync(ncclCoopCta(), cuda::memory_order_relaxed); }
  __device__ void sync_acq_rel() { barrier_.sync(ncclCoopCta(), cuda::memory_order_acq_rel); }

 private:
  ncclWindow_t window_;
  ncclLsaBarrierSession<ncclCoopCta> barrier_;
};

__global__ void __launch_bounds__(kThreads)
    block_exchange_kernel(ncclDevComm comm, ncclWindow_t window, const float* send, float* recv,
                          int64_t block) {
  LsaMemory memory(comm, window);
  block_exchange_cta(memory, comm.lsaRank, comm.lsaSize, block, blockIdx.x, gridDim.x, send, recv);
}

}  // namespace

void launch_block_exchange(const ncclDevComm& comm, ncclWindow_t window, const float* send,
                           float* recv, int64_t block, cudaStream_t stream) {
  block_exchange_kernel<<<NcclBlockExchange::kCtas, kThreads, 0, stream>>>(comm, window, send, recv,
                                                                           block);
}

}  // namespace moecore::dist
