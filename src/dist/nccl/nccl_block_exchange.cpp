#include "dist/nccl/nccl_block_exchange.h"

#include <exception>

#include "core/check.h"
#include "dist/block_exchange_steps.h"
#include "dist/nccl/nccl_check.h"
#include "kernels/cuda/runtime.h"

namespace moecore::dist {

NcclBlockExchange::NcclBlockExchange(ncclComm_t comm, cudaStream_t stream, int ranks,
                                     const std::string& name)
    : DeviceBlockExchange(ranks, name), comm_(comm), stream_(stream) {
  // The kernel inlines the headers' device API (the layouts of ncclDevComm and the windows):
  // only the library of the same version may fill them in.
  int version = 0;
  MOE_NCCL_CHECK(ncclGetVersion(&version), comm_, group());
  MOE_CHECK(version == NCCL_VERSION_CODE,
            "[nccl] parallel.rowwise_transport=\"symmetric\" on group '{}': the NCCL library "
            "loaded is version code {}, this program was built against {} (its kernel inlines "
            "that version's device API): run with the NCCL it was built with, or use \"padded\"",
            group(), version, NCCL_VERSION_CODE);
  // Every rank in one load/store team, asked of the host's communicator first: across nodes the
  // device communicator would try GPU-initiated networking and fail for another reason.
  const ncclTeam_t reachable = ncclTeamLsa(comm_);
  MOE_CHECK(reachable.nRanks == size(),
            "[nccl] parallel.rowwise_transport=\"symmetric\" on group '{}': its {} ranks do not "
            "all reach each other's memory by load and store (NVLink or PCIe peer-to-peer, one "
            "node: {} do); use \"padded\"",
            group(), size(), reachable.nRanks);
  ncclDevCommRequirements requirements{};
  requirements.lsaBarrierCount = kCtas;
  const ncclResult_t created = ncclDevCommCreate(comm_, &requirements, &device_comm_);
  MOE_CHECK(created == ncclSuccess,
            "[nccl] parallel.rowwise_transport=\"symmetric\" on group '{}': NCCL cannot make a "
            "device communicator ({}: {}); it needs symmetric memory (NCCL_CUMEM_ENABLE, a "
            "driver with virtual memory management): use \"padded\"",
            group(), ncclGetErrorString(created), ncclGetLastError(comm_));
  // The kernel indexes the blocks by LSA rank: with every rank in the LSA team that is the
  // group's rank (checked, since the blocks are laid out by the group's ranks).
  if (device_comm_.lsaSize != device_comm_.nRanks || device_comm_.lsaRank != device_comm_.rank) {
    const int reach = device_comm_.lsaSize, lsa_rank = device_comm_.lsaRank;
    const int rank = device_comm_.rank;
    ncclDevCommDestroy(comm_, &device_comm_);
    fail(
        "[nccl] parallel.rowwise_transport=\"symmetric\" on group '{}': its {} ranks do not all "
        "reach each other's memory by load and store in rank order (NVLink or PCIe peer-to-peer: "
        "{} do; rank {} is {} among them); use \"padded\"",
        group(), size(), reach, rank, lsa_rank);
  }
}

NcclBlockExchange::~NcclBlockExchange() {
  // While an exception unwinds the peers may never join these collective calls; the
  // communicator's abort (NcclCommunicator) releases what is left.
  if (std::uncaught_exceptions() > 0) return;
  try {
    release(window_);
    for (Window& retired : retired_) release(retired);
    MOE_NCCL_CHECK(ncclDevCommDestroy(comm_, &device_comm_), comm_, group());
  } catch (const Error&) {
    // A destructor cannot report: the job is ending, and the communicator goes with it.
  }
}

void NcclBlockExchange::release(Window& window) const {
  if (window.handle != nullptr) {
    MOE_NCCL_CHECK(cudaStreamSynchronize(stream_), comm_, group());  // no kernel still uses it
    MOE_NCCL_CHECK(ncclCommWindowDeregister(comm_, window.handle), comm_, group());
  }
  if (window.buffer != nullptr) MOE_NCCL_CHECK(ncclMemFree(window.buffer), comm_, group());
  window = Window{};
}

void NcclBlockExchange::reserve(size_t bytes) const {
  if (bytes <= window_.bytes) return;
  MOE_CHECK(!nccl::stream_capturing(stream_, comm_, group()),
            "[nccl] the symmetric exchange of group '{}' must grow to {} bytes inside a device "
            "graph's capture, where memory cannot be allocated or registered (the step graph's "
            "eager step sizes it first)",
            group(), bytes);
  if (window_.handle != nullptr) retired_.push_back(window_);
  window_ = Window{};
  Window grown;
  grown.bytes = bytes;
  MOE_NCCL_CHECK(ncclMemAlloc(&grown.buffer, grown.bytes), comm_, group());
  const ncclResult_t registered = ncclCommWindowRegister(comm_, grown.buffer, grown.bytes,
                                                         &grown.handle, NCCL_WIN_COLL_SYMMETRIC);
  if (registered != ncclSuccess) {
    ncclMemFree(grown.buffer);
    MOE_NCCL_CHECK(registered, comm_, group());
  }
  window_ = grown;
}

void NcclBlockExchange::do_exchange(const float* send, float* recv, int64_t block) const {
  MOE_CHECK(block >= 0, "[nccl] block exchange on group '{}': negative block {}", group(), block);
  if (block == 0) return;
  reserve(symmetric_window_bytes(size(), block));
  launch_block_exchange(device_comm_, window_.handle, send, recv, block, stream_);
  MOE_NCCL_CHECK(cudaGetLastError(), comm_, group());
  // MOECORE_CUDA_SYNC_EACH_OP (kernels/cuda/runtime.h): a fault of the kernel is reported here, by
  // the exchange that launched it, rather than by the next operation that waits.
  if (kernels::cuda::sync_each_op() && !nccl::stream_capturing(stream_, comm_, group())) {
    const cudaError_t status = cudaStreamSynchronize(stream_);
    if (status != cudaSuccess) {
      cudaGetLastError();
      nccl::fail_cuda_call(
          status, group(),
          "launch_block_exchange (found by MOECORE_CUDA_SYNC_EACH_OP's wait after it)", __FILE__,
          __LINE__);
    }
  }
}

}  // namespace moecore::dist
