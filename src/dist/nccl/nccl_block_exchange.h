// The device-initiated all-to-all of equal blocks (dist::DeviceBlockExchange) over NCCL's device
// API (NCCL 2.28 and later): the padded rowwise transport's blocks (parallel.rowwise_transport =
// "symmetric") stored by one kernel straight into each destination GPU's receive buffer, a window
// of NCCL's symmetric memory (ncclMemAlloc + ncclCommWindowRegister), reached by load and store
// (NCCL's LSA team: GPUs on NVLink or PCIe peer-to-peer). No send or receive is posted and the
// host waits for nothing: the kernel is enqueued on the communicator's stream, so a device graph
// captures it with the step.
//
// One exchange, in one kernel of kCtas blocks (nccl_block_exchange.cu): every CTA takes the same
// slice of every block on every rank and
//   1. meets the same CTA of every peer at an LSA barrier: their previous exchange has ended (its
//      kernel ran to the end before this one started on their streams), so nobody still reads
//      the slice about to be overwritten;
//   2. stores its slice of its send block for peer p into p's receive window at this rank's block;
//   3. meets them again (release, then acquire: their stores into this rank's window are seen);
//   4. copies its slice of every source's block from its own window into `recv`.
// The window is sized by the largest exchange so far and grows collectively: every rank of the
// group must exchange blocks of the same size at each call (the padded transport's static shapes
// give that; nothing here can check it without waiting on the host), so all grow at the same call.
// A window outgrown stays registered until the exchange is destroyed: a device graph captured
// before keeps writing to it when replayed. Growing inside a device graph's capture is a one-line
// error (allocation and registration cannot be captured); the step graph's eager step sizes it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moecore::dist {

class NcclBlockExchange final : public DeviceBlockExchange {
 public:
  // CTAs of the exchange kernel, and NCCL's LSA barriers: one per CTA.
  static constexpr int kCtas = 32;

  // Collective over comm's ranks (`ranks` of them, the group `name`): a device communicator with
  // one LSA barrier per CTA. One line when it cannot be made: an NCCL library at run time other
  // than the headers' (the device code inlines their layouts), no symmetric memory
  // (NCCL_CUMEM_ENABLE=0, a driver without virtual memory management), or ranks that do not all
  // reach each other's memory by load and store.
  NcclBlockExchange(ncclComm_t comm, cudaStream_t stream, int ranks, const std::string& name);
  ~NcclBlockExchange() override;  // collective (skipped while an exception unwinds)
  NcclBlockExchange(const NcclBlockExchange&) = delete;
  NcclBlockExchange& operator=(const NcclBlockExchange&) = delete;

 protected:
  void do_exchange(const float* send, float* recv, int64_t block) const override;

 private:
  // One registered window of symmetric memory.
  struct Window {
    void* buffer = nullptr;
    size_t bytes = 0;
    ncclWindow_t handle = nullptr;
  };

  // The window holds at least `bytes` (symmetric_window_bytes: whole granules; collective when
  // it grows; the outgrown one is retired).
  void reserve(size_t bytes) const;
  // Deregisters and frees a window (collective), after the stream has drained.
  void release(Window& window) const;

  ncclComm_t comm_;
  cudaStream_t stream_;
  ncclDevComm device_comm_{};
  mutable Window window_;
  mutable std::vector<Window> retired_;  // outgrown, kept for graphs captured on them
};

// The kernel (nccl_block_exchange.cu): block floats from send to every rank's window, then every
// source's block from this rank's window to recv, enqueued on `stream`.
void launch_block_exchange(const ncclDevComm& comm, ncclWindow_t window, const float* send,
                           float* recv, int64_t block, cudaStream_t stream);

}  // namespace moecore::dist
