// A stand-in for NCCL's communicator on the guarded device (tests/cpp/guarded_device.h; no GPU
// here): a group whose operations take the device's buffers as they are and are issued in order
// with the device's work, so that a device graph's capture holds them (Communicator::capturable).
// Outside a capture each operation runs at once over its MPI transport (which stages the guarded
// buffers through host memory); inside one it is recorded into the capture and runs at each
// replay, in order with the kernels, as NCCL's kernels do in a CUDA graph. As on NCCL, an operand
// in host memory inside a capture is a one-line error (it would be staged and waited for), and a
// non-blocking operation inside one returns no request (the device's order completes it).
// Its device-initiated block exchange (rowwise_transport = "symmetric") moves the blocks by the
// transport's all-to-all, in order with the device's work like the other operations: what the
// trainer sees of NCCL's (the exchange made collectively, counted as the group's all-to-all,
// captured with the step), not its kernel, which only a GPU runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moecore {

class StreamOrderedStandIn final : public dist::Communicator {
 public:
  // Over `transport` (an MPI group), named `name`; the transport carries another name, so that
  // the traffic counters keep the groups' own names for what the job issued.
  StreamOrderedStandIn(std::unique_ptr<dist::Communicator> transport, const std::string& name);

  std::unique_ptr<dist::Communicator> split(int color, int key,
                                            const std::string& name) const override;
  void barrier() const override { transport_->barrier(); }
  int max_tag() const override { return transport_->max_tag(); }
  bool reaches_device_memory() const override { return true; }
  bool capturable() const override { return true; }
  // Exchanges issued through the stand-ins' device-initiated block exchanges in this process so
  // far (a test's check that the symmetric transport was the one taken).
  static int64_t block_exchanges();

 protected:
  void do_allreduce(void* data, int64_t count, dist::CommType type,
                    dist::ReduceOp op) const override;
  dist::Request do_iallreduce(void* data, int64_t count, dist::CommType type,
                              dist::ReduceOp op) const override;
  void do_broadcast(void* data, int64_t bytes, int root) const override;
  void do_allgather(const void* send, void* recv, int64_t count,
                    dist::CommType type) const override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, dist::CommType type,
                         dist::ReduceOp op) const override;
  void do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                   dist::CommType type) const override;
  void do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& send_displs, void* recv,
                    const std::vector<int64_t>& recv_counts,
                    const std::vector<int64_t>& recv_displs, dist::CommType type) const override;
  dist::Request do_isend(const void* data, int64_t count, dist::CommType type, int dest,
                         int tag) const override;
  dist::Request do_irecv(void* data, int64_t count, dist::CommType type, int source,
                         int tag) const override;
  std::unique_ptr<dist::Window> do_window(int64_t count,
                                          const std::string& traffic_group) const override;
  std::unique_ptr<dist::DeviceBlockExchange> do_device_block_exchange() const override;

 private:
  // Runs `operation` now, or records it into the open capture after checking that every operand
  // (address, bytes) is in the device's memory.
  template <typename Operation>
  void issue(const char* op, std::initializer_list<std::pair<const void*, size_t>> operands,
             Operation operation) const;

  class BlockExchange;

  std::unique_ptr<dist::Communicator> transport_;
};

}  // namespace moecore
