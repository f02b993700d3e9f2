#include "dist/communicator.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "dist/traffic_counters.h"

namespace moecore::dist {

namespace {

// The traffic counters' op name: float payloads keep the plain name, other types a suffix.
std::string op_name(const char* op, CommType type, ReduceOp reduce = ReduceOp::kSum) {
  std::string name = op;
  if (reduce == ReduceOp::kMax) name += "_max";
  switch (type) {
    case CommType::kFloat32:
      break;
    case CommType::kFloat64:
      name += "_f64";
      break;
    case CommType::kInt64:
      name += "_i64";
      break;
    case CommType::kByte:
      name += "_u8";
      break;
  }
  return name;
}

// A group of one: its own part is the whole result (in host or a device's memory).
void copy_elements(const void* src, void* dst, int64_t count, CommType type) {
  if (count > 0 && src != dst)
    copy_bytes(dst, src, static_cast<size_t>(count) * comm_type_bytes(type));
}

// A buffer as a backend that reaches only host memory sees it: the buffer itself when it is host
// memory (or the backend takes device memory), else a host copy of its `bytes`, filled from it
// when `copy_in` and written back to it by copy_out().
class HostStage {
 public:
  HostStage(const void* data, size_t bytes, bool copy_in, bool backend_reaches_device)
      : device_data_(const_cast<void*>(data)), bytes_(bytes) {
    if (backend_reaches_device || bytes == 0 || device_of(data) == Device::kCpu) return;
    staged_.resize(bytes);
    const HostReadReason reason("MPI staging");
    if (copy_in) copy_bytes(staged_.data(), data, bytes);
  }
  void* host() { return staged_.empty() ? device_data_ : staged_.data(); }
  void copy_out() {
    if (!staged_.empty()) copy_bytes(device_data_, staged_.data(), bytes_);
  }

 private:
  void* device_data_;
  size_t bytes_;
  std::vector<std::byte> staged_;
};

// A non-blocking operation on a staged buffer: the stage lives until the operation completes,
// and its host copy goes back to the device buffer then (receives and reductions; a send's
// stage only has to outlive it).
class StagedWork final : public Work {
 public:
  StagedWork(Request backend, HostStage stage, bool copy_out)
      : backend_(std::move(backend)), stage_(std::move(stage)), copy_out_(copy_out) {}
  bool test() override {
    if (!done_ && dist::test(backend_)) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    dist::wait(backend_);
    finish();
  }

 private:
  void finish() {
    if (copy_out_) stage_.copy_out();
    done_ = true;
  }
  Request backend_;
  HostStage stage_;
  bool copy_out_;
  bool done_ = false;
};

// The backend's request, kept as it is when nothing was staged.
Request staged_request(Request backend, HostStage stage, const void* data, bool copy_out) {
  if (stage.host() == data) return backend;
  return std::make_unique<StagedWork>(std::move(backend), std::move(stage), copy_out);
}

// The elements a variable all-to-all touches in one buffer: up to the furthest displacement plus
// its count.
int64_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) {
  int64_t end = 0;
  for (size_t r = 0; r < counts.size(); ++r) end = std::max(end, displs[r] + counts[r]);
  return end;
}

}  // namespace

size_t comm_type_bytes(CommType type) {
  switch (type) {
    case CommType::kFloat32:
      return 4;
    case CommType::kFloat64:
      return 8;
    case CommType::kInt64:
      return 8;
    case CommType::kByte:
      return 1;
  }
  return 1;
}

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) wait(request);
  requests.clear();
}

void test_all(std::vector<Request>& requests) {
  for (Request& request : requests) test(request);
}

void wait(Request& request) {
  if (request) request->wait();
  request.reset();
}

bool test(Request& request) {
  if (request && request->test()) request.reset();
  return !request;
}

void Window::put(const float* src, int64_t count, int rank, int64_t offset) const {
  if (rank != rank_) count_traffic(traffic_group_, "put", count * 4);
  do_put(src, count, rank, offset);
}

void Window::get(float* dst, int64_t count, int rank, int64_t offset) const {
  if (rank != rank_) count_traffic(traffic_group_, "get", count * 4);
  do_get(dst, count, rank, offset);
}

void DeviceBlockExchange::exchange(const float* send, float* recv, int64_t block) const {
  count_traffic(group_, op_name("alltoall", CommType::kFloat32),
                block * 4 * static_cast<int64_t>(size_ - 1));
  do_exchange(send, recv, block);
}

std::unique_ptr<DeviceBlockExchange> Communicator::do_device_block_exchange() const {
  fail(
      "[parallel] group '{}' has no device-initiated all-to-all: parallel.rowwise_transport="
      "\"symmetric\" needs the NCCL communicator (train.device=\"cuda\", "
      "parallel.communicator=\"nccl\" or \"auto\" on a build with NCCL 2.28 or later)",
      name_);
}

void Communicator::allreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  if (size_ == 1) return;
  const size_t bytes = static_cast<size_t>(count) * comm_type_bytes(type);
  count_traffic(name_, op_name("allreduce", type, op), static_cast<int64_t>(bytes));
  HostStage stage(data, bytes, true, reaches_device_memory());
  do_allreduce(stage.host(), count, type, op);
  stage.copy_out();
}

Request Communicator::iallreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  if (size_ == 1) return nullptr;
  const size_t bytes = static_cast<size_t>(count) * comm_type_bytes(type);
  count_traffic(name_, op_name("allreduce", type, op), static_cast<int64_t>(bytes));
  HostStage stage(data, bytes, true, reaches_device_memory());
  Request backend = do_iallreduce(stage.host(), count, type, op);
  return staged_request(std::move(backend), std::move(stage), data, true);
}

void Communicator::broadcast(void* data, int64_t bytes, int root) const {
  if (size_ == 1) return;
  if (rank_ == root) count_traffic(name_, "broadcast", bytes);
  HostStage stage(data, static_cast<size_t>(bytes), rank_ == root, reaches_device_memory());
  do_broadcast(stage.host(), bytes, root);
  stage.copy_out();
}

void Communicator::allgather(const void* send, void* recv, int64_t count, CommType type) const {
  if (size_ == 1) return copy_elements(send, recv, count, type);
  const size_t bytes = static_cast<size_t>(count) * comm_type_bytes(type);
  count_traffic(name_, op_name("allgather", type), static_cast<int64_t>(bytes));
  HostStage send_stage(send, bytes, true, reaches_device_memory());
  HostStage recv_stage(recv, bytes * static_cast<size_t>(size_), false, reaches_device_memory());
  do_allgather(send_stage.host(), recv_stage.host(), count, type);
  recv_stage.copy_out();
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                                  ReduceOp op) const {
  if (size_ == 1) return copy_elements(send, recv, count, type);
  const size_t bytes = static_cast<size_t>(count) * comm_type_bytes(type);
  count_traffic(name_, op_name("reduce_scatter", type, op), static_cast<int64_t>(bytes) * size_);
  HostStage send_stage(send, bytes * static_cast<size_t>(size_), true, reaches_device_memory());
  HostStage recv_stage(recv, bytes, false, reaches_device_memory());
  do_reduce_scatter(send_stage.host(), recv_stage.host(), count, type, op);
  recv_stage.copy_out();
}

void Communicator::alltoall(const void* send, void* recv, int64_t count_per_rank,
                            CommType type) const {
  if (size_ == 1) return copy_elements(send, recv, count_per_rank, type);
  const size_t bytes = static_cast<size_t>(count_per_rank) * comm_type_bytes(type);
  count_traffic(name_, op_name("alltoall", type), static_cast<int64_t>(bytes) * (size_ - 1));
  HostStage send_stage(send, bytes * static_cast<size_t>(size_), true, reaches_device_memory());
  HostStage recv_stage(recv, bytes * static_cast<size_t>(size_), false, reaches_device_memory());
  do_alltoall(send_stage.host(), recv_stage.host(), count_per_rank, type);
  recv_stage.copy_out();
}

void Communicator::alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs, void* recv,
                             const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs, CommType type) const {
  const int64_t bytes = static_cast<int64_t>(comm_type_bytes(type));
  if (size_ == 1)
    return copy_elements(static_cast<const char*>(send) + send_displs[0] * bytes,
                         static_cast<char*>(recv) + recv_displs[0] * bytes, send_counts[0], type);
  int64_t to_others = 0;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) to_others += send_counts[static_cast<size_t>(r)];
  count_traffic(name_, op_name("alltoallv", type), to_others * bytes);
  HostStage send_stage(send, static_cast<size_t>(extent(send_counts, send_displs) * bytes), true,
                       reaches_device_memory());
  HostStage recv_stage(recv, static_cast<size_t>(extent(recv_counts, recv_displs) * bytes), false,
                       reaches_device_memory());
  do_alltoallv(send_stage.host(), send_counts, send_displs, recv_stage.host(), recv_counts,
               recv_displs, type);
  recv_stage.copy_out();
}

Request Communicator::isend(const void* data, int64_t count, CommType type, int dest,
                            int tag) const {
  const size_t bytes = static_cast<size_t>(count) * comm_type_bytes(type);
  count_traffic(name_, op_name("send", type), static_cast<int64_t>(bytes));
  HostStage stage(data, bytes, true, reaches_device_memory());
  Request backend = do_isend(stage.host(), count, type, dest, tag);
  return staged_request(std::move(backend), std::move(stage), data, false);
}

Request Communicator::irecv(void* data, int64_t count, CommType type, int source, int tag) const {
  HostStage stage(data, static_cast<size_t>(count) * comm_type_bytes(type), false,
                  reaches_device_memory());
  Request backend = do_irecv(stage.host(), count, type, source, tag);
  return staged_request(std::move(backend), std::move(stage), data, true);
}

}  // namespace moecore::dist
