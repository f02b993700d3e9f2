#include "stream_ordered_stand_in.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "guarded_device.h"

namespace moecore {

namespace {

using dist::CommType;
using dist::ReduceOp;
using dist::Request;

// How many bytes an all-to-all's buffer spans: the end of its furthest part.
size_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
              CommType type) {
  int64_t end = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) end = std::max(end, displs[i] + counts[i]);
  return static_cast<size_t>(end) * dist::comm_type_bytes(type);
}

size_t bytes_of(int64_t count, CommType type) {
  return static_cast<size_t>(count) * dist::comm_type_bytes(type);
}

int64_t g_block_exchanges = 0;

}  // namespace

// The stand-in's device-initiated exchange: its blocks by the stand-in's (captured) all-to-all.
class StreamOrderedStandIn::BlockExchange final : public dist::DeviceBlockExchange {
 public:
  explicit BlockExchange(const StreamOrderedStandIn& group)
      : DeviceBlockExchange(group.size(), group.name()), group_(group) {}

 protected:
  void do_exchange(const float* send, float* recv, int64_t block) const override {
    ++g_block_exchanges;
    const dist::Communicator* t = group_.transport_.get();
    const size_t bytes = bytes_of(block, CommType::kFloat32) * static_cast<size_t>(group_.size());
    group_.issue("block exchange", {{send, bytes}, {recv, bytes}},
                 [=] { t->alltoall(send, recv, block, CommType::kFloat32); });
  }

 private:
  const StreamOrderedStandIn& group_;
};

StreamOrderedStandIn::StreamOrderedStandIn(std::unique_ptr<dist::Communicator> transport,
                                           const std::string& name)
    : Communicator(transport->rank(), transport->size(), name), transport_(std::move(transport)) {}

std::unique_ptr<dist::Communicator> StreamOrderedStandIn::split(int color, int key,
                                                                const std::string& name) const {
  return std::make_unique<StreamOrderedStandIn>(
      transport_->split(color, key, name + " (stand-in's MPI)"), name);
}

template <typename Operation>
void StreamOrderedStandIn::issue(const char* op,
                                 std::initializer_list<std::pair<const void*, size_t>> operands,
                                 Operation operation) const {
  if (!guarded_device::capture_open()) {
    operation();
    return;
  }
  for (const auto& [data, bytes] : operands) {
    MOE_CHECK(bytes == 0 || device_of(data) != Device::kCpu,
              "[nccl stand-in] {} on group '{}' inside a device graph's capture was given host "
              "memory ({} bytes): a captured step's collectives take device buffers",
              op, name(), bytes);
  }
  guarded_device::record_in_capture(std::move(operation));
}

void StreamOrderedStandIn::do_allreduce(void* data, int64_t count, CommType type,
                                        ReduceOp op) const {
  const dist::Communicator* t = transport_.get();
  issue("allreduce", {{data, bytes_of(count, type)}}, [=] { t->allreduce(data, count, type, op); });
}

Request StreamOrderedStandIn::do_iallreduce(void* data, int64_t count, CommType type,
                                            ReduceOp op) const {
  if (!guarded_device::capture_open()) return transport_->iallreduce(data, count, type, op);
  do_allreduce(data, count, type, op);  // recorded; the replay's order completes it
  return nullptr;
}

void StreamOrderedStandIn::do_broadcast(void* data, int64_t bytes, int root) const {
  const dist::Communicator* t = transport_.get();
  issue("broadcast", {{data, static_cast<size_t>(bytes)}},
        [=] { t->broadcast(data, bytes, root); });
}

void StreamOrderedStandIn::do_allgather(const void* send, void* recv, int64_t count,
                                        CommType type) const {
  const dist::Communicator* t = transport_.get();
  issue(
      "allgather",
      {{send, bytes_of(count, type)}, {recv, bytes_of(count, type) * static_cast<size_t>(size())}},
      [=] { t->allgather(send, recv, count, type); });
}

void StreamOrderedStandIn::do_reduce_scatter(const void* send, void* recv, int64_t count,
                                             CommType type, ReduceOp op) const {
  const dist::Communicator* t = transport_.get();
  issue(
      "reduce_scatter",
      {{send, bytes_of(count, type) * static_cast<size_t>(size())}, {recv, bytes_of(count, type)}},
      [=] { t->reduce_scatter(send, recv, count, type, op); });
}

void StreamOrderedStandIn::do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                                       CommType type) const {
  const dist::Communicator* t = transport_.get();
  const size_t bytes = bytes_of(count_per_rank, type) * static_cast<size_t>(size());
  issue("alltoall", {{send, bytes}, {recv, bytes}},
        [=] { t->alltoall(send, recv, count_per_rank, type); });
}

void StreamOrderedStandIn::do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                        const std::vector<int64_t>& send_displs, void* recv,
                                        const std::vector<int64_t>& recv_counts,
                                        const std::vector<int64_t>& recv_displs,
                                        CommType type) const {
  const dist::Communicator* t = transport_.get();
  issue(
      "alltoallv",
      {{send, extent(send_counts, send_displs, type)},
       {recv, extent(recv_counts, recv_displs, type)}},
      [=] { t->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, type); });
}

Request StreamOrderedStandIn::do_isend(const void* data, int64_t count, CommType type, int dest,
                                       int tag) const {
  MOE_CHECK(!guarded_device::capture_open(),
            "[nccl stand-in] isend on group '{}' inside a capture: pipeline stages stay on MPI",
            name());
  return transport_->isend(data, count, type, dest, tag);
}

Request StreamOrderedStandIn::do_irecv(void* data, int64_t count, CommType type, int source,
                                       int tag) const {
  MOE_CHECK(!guarded_device::capture_open(),
            "[nccl stand-in] irecv on group '{}' inside a capture: pipeline stages stay on MPI",
            name());
  return transport_->irecv(data, count, type, source, tag);
}

std::unique_ptr<dist::Window> StreamOrderedStandIn::do_window(int64_t /*count*/,
                                                              const std::string& /*group*/) const {
  fail("[nccl stand-in] window on group '{}': NCCL has none", name());
}

int64_t StreamOrderedStandIn::block_exchanges() {
  return g_block_exchanges;
}

std::unique_ptr<dist::DeviceBlockExchange> StreamOrderedStandIn::do_device_block_exchange() const {
  return std::make_unique<BlockExchange>(*this);
}

}  // namespace moecore
