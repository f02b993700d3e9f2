// dist::Communicator over an NCCL communicator, for ranks that each drive one GPU: every rank
// selects its device (cudaSetDevice) before it creates a communicator or issues any CUDA work,
// so that the CUDA backend's stream (kernels::cuda::stream()) and this communicator's buffers
// live on that device. Every operation is issued on that stream, ordered with the backend's
// kernels: nothing here waits on another stream or the legacy default stream.
//
// What "blocking" means depends on the memory:
//   - device memory (the model's tensors): allreduce, broadcast, allgather, reduce_scatter,
//     alltoall and alltoallv return once the operation is enqueued on the stream. Its result is
//     complete before any later operation of the backend (every kernel and copy on the stream)
//     runs; the host sees it after kernels::cuda::synchronize().
//   - host memory (the trainer's statistics, e.g. Transformer::batch_sum's doubles): NCCL reads
//     and writes device memory only, so the operation goes through a device buffer this
//     communicator owns (grown to the largest operation seen): inputs are copied in on the
//     stream, outputs copied back, and the call returns once the stream has finished, as MPI's
//     would. A host operand makes the whole call wait, whatever memory its other operand is in.
// The non-blocking operations (iallreduce, isend, irecv) take device memory only and reject host
// pointers with one line: staging them would hide a copy and a wait inside Work::wait(), and the
// callers that overlap communication with compute hand device buffers in a CUDA run. Their Work
// is a CUDA event recorded on the stream after the operation: test() queries it, wait() waits for
// it on the host (later kernels on the stream are ordered after the operation anyway).
//
// Point-to-point transfers have no tags in NCCL: a receive matches the peer's next send to this
// rank, in the order both sides issue them (FIFO per pair of ranks). The tags the callers pass
// are accepted and ignored, and max_tag() is the largest int so that their checks of the tag
// space keep passing. A send or receive occupies the stream until its peer's matching call runs
// (NCCL's point-to-point is blocking for the GPU): a receive posted ahead holds back every later
// kernel of the backend until its message arrives, and two ranks that both send before they
// receive may wait for each other. alltoall and alltoallv post their sends and receives as one
// NCCL group, which progresses them together.
//
// MPI-style windows (host-initiated one-sided puts and gets, which the rowwise dispatch's window
// transport uses on the CPU) are not implemented: window() throws one line saying so. The GPU's
// one-sided transport is device-initiated instead: device_block_exchange() gives the padded
// transport's all-to-all done by a kernel that stores into the peers' symmetric memory
// (nccl_block_exchange.h; NCCL 2.28's device API).
//
// The communicator owns its ncclComm_t and destroys it with itself (ncclCommDestroy, after the
// stream has drained): like windows, communicators are destroyed by every rank of the group
// together. One destroyed while an exception unwinds (an error on this rank) is aborted instead
// (ncclCommAbort: no wait for the stream or the peers), so that the rank gets to end the job. It is
// not final: the tests reach the NCCL paths of the collectives on a group of one (which the base
// class completes without calling the backend) through a subclass.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moecore::dist {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap` (the MPI world or any group of it): its rank 0 creates NCCL's
  // unique id and broadcasts it over `bootstrap`; the new communicator has the same ranks in the
  // same order. One GPU per rank, selected before the call.
  static std::unique_ptr<NcclCommunicator> create(const Communicator& bootstrap,
                                                  const std::string& name);
  // A group of this process alone, on the current device, with no bootstrap communicator.
  static std::unique_ptr<NcclCommunicator> create_single(const std::string& name);

  // Takes over `comm` (the device it was created on must be current when operations are
  // issued); every operation is issued on `stream`, which must belong to that device. The
  // factories above pass the CUDA backend's stream; a process that drives several GPUs (a
  // test with one thread per device) passes a stream of each device.
  NcclCommunicator(ncclComm_t comm, std::string name, cudaStream_t stream);
  ~NcclCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) const override;
  // Returns once every rank of the group has reached it and this rank's work issued on the
  // stream before it has completed (a one-element all-reduce, then a stream synchronisation).
  void barrier() const override;
  int max_tag() const override;
  bool reaches_device_memory() const override { return true; }  // device operands only enqueued
  // On the stream: a capture holds them (NCCL 2.9 and later); host operands, which would be
  // staged and waited for, are an error inside one.
  bool capturable() const override { return true; }

 protected:
  void do_allreduce(void* data, int64_t count, CommType type, ReduceOp op) const override;
  Request do_iallreduce(void* data, int64_t count, CommType type, ReduceOp op) const override;
  void do_broadcast(void* data, int64_t bytes, int root) const override;
  void do_allgather(const void* send, void* recv, int64_t count, CommType type) const override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                         ReduceOp op) const override;
  void do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                   CommType type) const override;
  void do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& send_displs, void* recv,
                    const std::vector<int64_t>& recv_counts,
                    const std::vector<int64_t>& recv_displs, CommType type) const override;
  Request do_isend(const void* data, int64_t count, CommType type, int dest,
                   int tag) const override;
  Request do_irecv(void* data, int64_t count, CommType type, int source, int tag) const override;
  std::unique_ptr<Window> do_window(int64_t count, const std::string& traffic_group) const override;
  std::unique_ptr<DeviceBlockExchange> do_device_block_exchange() const override;

 private:
  // One buffer an operation reads (input), writes (output) or both, and where NCCL sees it: the
  // caller's device memory, or its place in the staging buffer. `data` is const for the inputs'
  // sake; an output's is the caller's writable memory.
  struct Operand {
    const void* data;
    size_t bytes;
    bool input;
    bool output;
    void* device = nullptr;
    bool staged = false;
  };

  // Fills each operand's device address, staging host memory: grows the staging buffer and
  // copies the inputs in on the stream.
  void stage(std::span<Operand> operands) const;
  // Copies the staged outputs back to the host and waits for the stream.
  void unstage(std::span<const Operand> operands) const;
  // The staging buffer, at least `bytes` long; a longer one replaces it once the stream is idle.
  void* staging_buffer(size_t bytes) const;
  // The non-blocking operations take device memory only.
  void require_device_memory(const void* data, size_t bytes, const char* op) const;
  // Whether a device graph's capture is recording the stream (then no host waits or copies).
  bool capturing() const;
  // Under MOECORE_CUDA_SYNC_EACH_OP (kernels/cuda/runtime.h), outside a capture: waits for the
  // collective `op` just issued, so that a fault of NCCL's kernels is reported by it, naming it,
  // rather than by the backend's next operation. Not after isend / irecv: a rank waiting there
  // before posting its own receive could hold up its peer.
  void wait_if_syncing_each_op(const char* op) const;
  // The request of a non-blocking operation just issued: an event to wait on, or none inside a
  // capture (an event's host wait would break it; the stream's order completes the operation
  // before the work issued after it).
  Request issued_work() const;
  // ncclSend / ncclRecv of all-to-all exchanges between ncclGroupStart and ncclGroupEnd.
  void exchange(const char* send, const std::vector<int64_t>& send_counts,
                const std::vector<int64_t>& send_displs, char* recv,
                const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                CommType type) const;

  ncclComm_t comm_;  // null for a rank that a split left out (a group of one)
  cudaStream_t stream_;
  mutable void* staging_ = nullptr;
  mutable size_t staging_bytes_ = 0;
};

}  // namespace moecore::dist
