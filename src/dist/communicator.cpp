#include "dist/communicator.h"

#include <cstring>

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

// A group of one: its own part is the whole result.
void copy_elements(const void* src, void* dst, int64_t count, CommType type) {
  if (count > 0 && src != dst)
    std::memmove(dst, src, static_cast<size_t>(count) * comm_type_bytes(type));
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

void Communicator::allreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  if (size_ == 1) return;
  count_traffic(name_, op_name("allreduce", type, op),
                count * static_cast<int64_t>(comm_type_bytes(type)));
  do_allreduce(data, count, type, op);
}

Request Communicator::iallreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  if (size_ == 1) return nullptr;
  count_traffic(name_, op_name("allreduce", type, op),
                count * static_cast<int64_t>(comm_type_bytes(type)));
  return do_iallreduce(data, count, type, op);
}

void Communicator::broadcast(void* data, int64_t bytes, int root) const {
  if (size_ == 1) return;
  if (rank_ == root) count_traffic(name_, "broadcast", bytes);
  do_broadcast(data, bytes, root);
}

void Communicator::allgather(const void* send, void* recv, int64_t count, CommType type) const {
  if (size_ == 1) return copy_elements(send, recv, count, type);
  count_traffic(name_, op_name("allgather", type),
                count * static_cast<int64_t>(comm_type_bytes(type)));
  do_allgather(send, recv, count, type);
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                                  ReduceOp op) const {
  if (size_ == 1) return copy_elements(send, recv, count, type);
  count_traffic(name_, op_name("reduce_scatter", type, op),
                count * size_ * static_cast<int64_t>(comm_type_bytes(type)));
  do_reduce_scatter(send, recv, count, type, op);
}

void Communicator::alltoall(const void* send, void* recv, int64_t count_per_rank,
                            CommType type) const {
  if (size_ == 1) return copy_elements(send, recv, count_per_rank, type);
  count_traffic(name_, op_name("alltoall", type),
                count_per_rank * (size_ - 1) * static_cast<int64_t>(comm_type_bytes(type)));
  do_alltoall(send, recv, count_per_rank, type);
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
  do_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, type);
}

Request Communicator::isend(const void* data, int64_t count, CommType type, int dest,
                            int tag) const {
  count_traffic(name_, op_name("send", type), count * static_cast<int64_t>(comm_type_bytes(type)));
  return do_isend(data, count, type, dest, tag);
}

Request Communicator::irecv(void* data, int64_t count, CommType type, int source, int tag) const {
  return do_irecv(data, count, type, source, tag);
}

}  // namespace moecore::dist
