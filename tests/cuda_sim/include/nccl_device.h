// cudasim: NCCL 2.28's device API as nccl_block_exchange.cu uses it (nccl.h says what cudasim's
// NCCL is; nccl_sim_symmetric.cpp implements it). Symmetric memory is a file each process maps
// (ncclMemAlloc); a registered window maps every peer's, so a kernel's load or store through
// ncclGetLsaPointer reaches the peer's memory as NVLink's would. The window's handle lives in the
// emulated device's memory, as NCCL's does, so a kernel may take it as an argument. The LSA barrier
// meets the same barrier of every peer: the block's threads meet first (__syncthreads), one of them
// meets the peers through counters in the communicator's shared memory (release on arrival, acquire
// on leaving), then the block again. The blocks of a launch run one after the other in every
// process, in the same order, so the same block of every rank reaches each barrier in turn.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace cuda {
using memory_order = ::std::memory_order;
inline constexpr memory_order memory_order_relaxed = ::std::memory_order_relaxed;
inline constexpr memory_order memory_order_acquire = ::std::memory_order_acquire;
inline constexpr memory_order memory_order_release = ::std::memory_order_release;
inline constexpr memory_order memory_order_acq_rel = ::std::memory_order_acq_rel;
inline constexpr memory_order memory_order_seq_cst = ::std::memory_order_seq_cst;
}  // namespace cuda

struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;

// The barriers a device communicator was given (ncclDevCommRequirements::lsaBarrierCount): the
// first of them among its communicator's, and how many.
struct ncclLsaBarrierHandle {
  uint32_t first;
  uint32_t count;
};

namespace cudasim::nccl {
class Comm;
inline constexpr int kMaxRanks = 64;
// Meets barrier `index` of `handle`'s in every rank of `comm` (one thread of the block).
void lsa_barrier(Comm* comm, ncclLsaBarrierHandle handle, uint32_t index);
// Ends the process: a pointer `offset` bytes into a window of `bytes`, past its end.
[[noreturn]] void window_out_of_bounds(size_t offset, size_t bytes);
}  // namespace cudasim::nccl

// Where a window is, in this process and in every peer's (nccl_sim_symmetric.cpp fills it in).
struct ncclWindow_vidmem {
  size_t bytes;
  int ranks;
  char* base[cudasim::nccl::kMaxRanks];  // every rank's window, mapped into this process
  int rank;
};

struct ncclDevComm {
  int rank, nRanks;
  int lsaRank, lsaSize;
  ncclLsaBarrierHandle lsaBarrier;
  cudasim::nccl::Comm* simComm;  // the host's communicator, for the barriers' counters
};
typedef struct ncclDevComm ncclDevComm_t;

struct ncclDevCommRequirements {
  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;
};
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;

ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* requirements,
                               ncclDevComm_t* out_dev_comm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* dev_comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm);
inline ncclTeam_t ncclTeamLsa(ncclDevComm const& comm) {
  return {comm.lsaSize, comm.lsaRank, 1};
}

inline void* ncclGetLocalPointer(ncclWindow_t window, size_t offset) {
  if (offset >= window->bytes) cudasim::nccl::window_out_of_bounds(offset, window->bytes);
  return window->base[window->rank] + offset;
}
inline void* ncclGetLsaPointer(ncclWindow_t window, size_t offset, int peer) {
  if (offset >= window->bytes) cudasim::nccl::window_out_of_bounds(offset, window->bytes);
  return window->base[peer] + offset;
}

// The cooperative group of a whole CTA.
struct ncclCoopCta {};

template <typename Coop>
struct ncclLsaBarrierSession {
  ncclLsaBarrierSession(Coop, ncclDevComm const& comm, ncclTeam team, ncclLsaBarrierHandle handle,
                        uint32_t index)
      : comm_(comm.simComm), handle_(handle), index_(index), ranks_(team.nRanks) {}
  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;

  // Every rank's same CTA has arrived, and what they wrote before is seen: always with acquire and
  // release, whatever the order asked (a kernel that asks for relaxed where it needs acquire is not
  // caught here; the host's memory model is stronger than the GPU's anyway).
  void sync(Coop, cuda::memory_order) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && ranks_ > 1)
      cudasim::nccl::lsa_barrier(comm_, handle_, index_);
    __syncthreads();
  }

 private:
  cudasim::nccl::Comm* comm_;
  ncclLsaBarrierHandle handle_;
  uint32_t index_;
  int ranks_;
};
