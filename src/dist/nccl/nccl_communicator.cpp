#include "dist/nccl/nccl_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <utility>

#include "core/check.h"
#include "dist/nccl/nccl_check.h"
#if MOECORE_NCCL_DEVICE_API
#include "dist/nccl/nccl_block_exchange.h"
#endif
#include "kernels/cuda/runtime.h"

namespace moecore::dist {

namespace {

// Operands in the staging buffer start on cudaMalloc's own alignment, which every element type
// and NCCL's vectorised copies are happy with.
constexpr size_t kStagingAlignment = 256;

size_t staged_size(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

ncclDataType_t nccl_type(CommType type) {
  switch (type) {
    case CommType::kFloat32:
      return ncclFloat32;
    case CommType::kFloat64:
      return ncclFloat64;
    case CommType::kInt64:
      return ncclInt64;
    case CommType::kByte:
      return ncclUint8;
  }
  return ncclUint8;
}

// Bytes move but are not added or compared: MPI has no reduction of MPI_BYTE either, and both
// backends must accept the same calls.
ncclRedOp_t nccl_reduction(ReduceOp op, CommType type, const char* call, const std::string& group) {
  MOE_CHECK(type != CommType::kByte,
            "[nccl] {} on group '{}': bytes cannot be reduced (use an integer or floating-point "
            "type)",
            call, group);
  return op == ReduceOp::kMax ? ncclMax : ncclSum;
}

size_t element_count(int64_t count, const char* call, const std::string& group) {
  MOE_CHECK(count >= 0, "[nccl] {} on group '{}': negative count or displacement {}", call, group,
            count);
  return static_cast<size_t>(count);
}

int rank_of(ncclComm_t comm, const std::string& group) {
  int rank = 0;
  if (comm != nullptr) MOE_NCCL_CHECK(ncclCommUserRank(comm, &rank), comm, group);
  return rank;
}

int size_of(ncclComm_t comm, const std::string& group) {
  int size = 1;
  if (comm != nullptr) MOE_NCCL_CHECK(ncclCommCount(comm, &size), comm, group);
  return size;
}

// Pageable (unregistered) and pinned host memory alike: NCCL's kernels read and write device
// memory only.
bool in_host_memory(const void* data, const std::string& group) {
  cudaPointerAttributes attributes{};
  MOE_NCCL_CHECK(cudaPointerGetAttributes(&attributes, data), nullptr, group);
  return attributes.type == cudaMemoryTypeHost || attributes.type == cudaMemoryTypeUnregistered;
}

// A non-blocking operation: the event recorded on the stream right after it.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t event, std::string group) : event_(event), group_(std::move(group)) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  ~NcclWork() override { cudaEventDestroy(event_); }

  bool test() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    nccl::check(status, nullptr, group_, "cudaEventQuery", __FILE__, __LINE__);
    return true;
  }
  void wait() override { MOE_NCCL_CHECK(cudaEventSynchronize(event_), nullptr, group_); }

 private:
  cudaEvent_t event_;
  std::string group_;
};

Request record_work(cudaStream_t stream, const std::string& group) {
  cudaEvent_t event = nullptr;
  MOE_NCCL_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), nullptr, group);
  auto work = std::make_unique<NcclWork>(event, group);  // destroys the event from here on
  MOE_NCCL_CHECK(cudaEventRecord(event, stream), nullptr, group);
  return work;
}

// How many elements an all-to-all's buffer spans: the end of its furthest part.
int64_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) {
  int64_t end = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) end = std::max(end, displs[i] + counts[i]);
  return end;
}

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const Communicator& bootstrap,
                                                           const std::string& name) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) MOE_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, name);
  bootstrap.broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  MOE_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), nullptr, name);
  return std::make_unique<NcclCommunicator>(comm, name, kernels::cuda::stream());
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_single(const std::string& name) {
  int device = 0;
  MOE_NCCL_CHECK(cudaGetDevice(&device), nullptr, name);
  ncclComm_t comm = nullptr;
  MOE_NCCL_CHECK(ncclCommInitAll(&comm, 1, &device), nullptr, name);
  return std::make_unique<NcclCommunicator>(comm, name, kernels::cuda::stream());
}

// `name` is copied, not moved: the rank and size are looked up with it in the same call.
NcclCommunicator::NcclCommunicator(ncclComm_t comm, std::string name, cudaStream_t stream)
    : Communicator(rank_of(comm, name), size_of(comm, name), name), comm_(comm), stream_(stream) {}

// Nothing on the stream may still use the communicator or the staging buffer when they go. A
// destructor cannot throw: an error the stream raised was reported to whoever waited on it.
// Unwinding after an error (this rank's, which ends the job next: main.cpp's fail_job), the
// stream may hold an operation that waits for peers that will never join it, and
// ncclCommDestroy waits for the other ranks of the node: the communicator is aborted instead
// (its operations on the device cancelled), so that the rank reaches the job's abort. Its staging
// buffer is left to the process's end then: cudaFree waits for the whole device, where the
// operation of a group not aborted yet (the mesh's groups go one by one, the world last) may
// still wait for its peers.
NcclCommunicator::~NcclCommunicator() {
  if (std::uncaught_exceptions() > 0) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    return;
  }
  cudaStreamSynchronize(stream_);
  if (comm_ != nullptr) ncclCommDestroy(comm_);
  if (staging_ != nullptr) cudaFree(staging_);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key,
                                                      const std::string& name) const {
  if (comm_ == nullptr) return std::make_unique<NcclCommunicator>(nullptr, name, stream_);
  ncclComm_t sub = nullptr;
  MOE_NCCL_CHECK(
      ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr),
      comm_, this->name());
  return std::make_unique<NcclCommunicator>(sub, name, stream_);  // null sub: a group of one
}

void NcclCommunicator::barrier() const {
  if (comm_ != nullptr) {
    // Zeroed first, so that the sum reads nothing uninitialised.
    void* flag = staging_buffer(sizeof(int64_t));
    MOE_NCCL_CHECK(cudaMemsetAsync(flag, 0, sizeof(int64_t), stream_), comm_, name());
    MOE_NCCL_CHECK(ncclAllReduce(flag, flag, 1, ncclInt64, ncclSum, comm_, stream_), comm_, name());
  }
  MOE_NCCL_CHECK(cudaStreamSynchronize(stream_), comm_, name());
}

int NcclCommunicator::max_tag() const {
  return std::numeric_limits<int>::max();  // tags are not sent (see the header)
}

std::unique_ptr<Window> NcclCommunicator::do_window(int64_t /*count*/,
                                                    const std::string& /*traffic_group*/) const {
  fail(
      "[nccl] window on group '{}': NCCL windows are not implemented yet (host-initiated puts "
      "and gets; the rowwise dispatch on GPUs moves its rows with parallel.rowwise_transport="
      "\"padded\" or \"symmetric\")",
      name());
}

std::unique_ptr<DeviceBlockExchange> NcclCommunicator::do_device_block_exchange() const {
#if MOECORE_NCCL_DEVICE_API
  MOE_CHECK(comm_ != nullptr,
            "[nccl] group '{}' is a group of one that no NCCL communicator backs (a rank a split "
            "left out): it has no device-initiated exchange",
            name());
  return std::make_unique<NcclBlockExchange>(comm_, stream_, size(), name());
#else
  fail(
      "[nccl] group '{}': this program was built against NCCL {}.{}, which has no device API "
      "(2.28 or later) for parallel.rowwise_transport=\"symmetric\": use \"padded\"",
      name(), NCCL_MAJOR, NCCL_MINOR);
#endif
}

void NcclCommunicator::do_allreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  const ncclRedOp_t reduction = nccl_reduction(op, type, "allreduce", name());
  const size_t n = element_count(count, "allreduce", name());
  std::array operands{
      Operand{.data = data, .bytes = n * comm_type_bytes(type), .input = true, .output = true}};
  stage(operands);
  MOE_NCCL_CHECK(ncclAllReduce(operands[0].device, operands[0].device, n, nccl_type(type),
                               reduction, comm_, stream_),
                 comm_, name());
  wait_if_syncing_each_op("allreduce");
  unstage(operands);
}

Request NcclCommunicator::do_iallreduce(void* data, int64_t count, CommType type,
                                        ReduceOp op) const {
  const ncclRedOp_t reduction = nccl_reduction(op, type, "iallreduce", name());
  const size_t n = element_count(count, "iallreduce", name());
  require_device_memory(data, n * comm_type_bytes(type), "iallreduce");
  MOE_NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(type), reduction, comm_, stream_), comm_,
                 name());
  wait_if_syncing_each_op("iallreduce");
  return issued_work();
}

void NcclCommunicator::do_broadcast(void* data, int64_t bytes, int root) const {
  const size_t n = element_count(bytes, "broadcast", name());
  std::array operands{
      Operand{.data = data, .bytes = n, .input = rank() == root, .output = rank() != root}};
  stage(operands);
  MOE_NCCL_CHECK(
      ncclBroadcast(operands[0].device, operands[0].device, n, ncclUint8, root, comm_, stream_),
      comm_, name());
  wait_if_syncing_each_op("broadcast");
  unstage(operands);
}

void NcclCommunicator::do_allgather(const void* send, void* recv, int64_t count,
                                    CommType type) const {
  const size_t n = element_count(count, "allgather", name());
  const size_t part = n * comm_type_bytes(type);
  std::array operands{Operand{.data = send, .bytes = part, .input = true, .output = false},
                      Operand{.data = recv,
                              .bytes = part * static_cast<size_t>(size()),
                              .input = false,
                              .output = true}};
  stage(operands);
  MOE_NCCL_CHECK(
      ncclAllGather(operands[0].device, operands[1].device, n, nccl_type(type), comm_, stream_),
      comm_, name());
  wait_if_syncing_each_op("allgather");
  unstage(operands);
}

void NcclCommunicator::do_reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                                         ReduceOp op) const {
  const ncclRedOp_t reduction = nccl_reduction(op, type, "reduce_scatter", name());
  const size_t n = element_count(count, "reduce_scatter", name());
  const size_t part = n * comm_type_bytes(type);
  std::array operands{Operand{.data = send,
                              .bytes = part * static_cast<size_t>(size()),
                              .input = true,
                              .output = false},
                      Operand{.data = recv, .bytes = part, .input = false, .output = true}};
  stage(operands);
  MOE_NCCL_CHECK(ncclReduceScatter(operands[0].device, operands[1].device, n, nccl_type(type),
                                   reduction, comm_, stream_),
                 comm_, name());
  wait_if_syncing_each_op("reduce_scatter");
  unstage(operands);
}

void NcclCommunicator::do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                                   CommType type) const {
  element_count(count_per_rank, "alltoall", name());
  const size_t ranks = static_cast<size_t>(size());
  const std::vector<int64_t> counts(ranks, count_per_rank);
  std::vector<int64_t> displs(ranks);
  for (size_t r = 0; r < ranks; ++r) displs[r] = static_cast<int64_t>(r) * count_per_rank;
  do_alltoallv(send, counts, displs, recv, counts, displs, type);
}

void NcclCommunicator::do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& send_displs, void* recv,
                                    const std::vector<int64_t>& recv_counts,
                                    const std::vector<int64_t>& recv_displs, CommType type) const {
  for (size_t r = 0; r < static_cast<size_t>(size()); ++r) {
    element_count(send_counts[r], "alltoallv", name());
    element_count(send_displs[r], "alltoallv", name());
    element_count(recv_counts[r], "alltoallv", name());
    element_count(recv_displs[r], "alltoallv", name());
  }
  const size_t bytes = comm_type_bytes(type);
  // recv is an input as well: its parts may leave gaps, which a staged copy must bring back
  // unchanged.
  std::array operands{
      Operand{.data = send,
              .bytes = static_cast<size_t>(extent(send_counts, send_displs)) * bytes,
              .input = true,
              .output = false},
      Operand{.data = recv,
              .bytes = static_cast<size_t>(extent(recv_counts, recv_displs)) * bytes,
              .input = true,
              .output = true}};
  stage(operands);
  exchange(static_cast<const char*>(operands[0].device), send_counts, send_displs,
           static_cast<char*>(operands[1].device), recv_counts, recv_displs, type);
  wait_if_syncing_each_op("alltoallv");
  unstage(operands);
}

void NcclCommunicator::exchange(const char* send, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& send_displs, char* recv,
                                const std::vector<int64_t>& recv_counts,
                                const std::vector<int64_t>& recv_displs, CommType type) const {
  const size_t bytes = comm_type_bytes(type);
  MOE_NCCL_CHECK(ncclGroupStart(), comm_, name());
  try {
    // Empty parts are left out on both sides alike: a rank's send count to a peer is that
    // peer's receive count from it.
    for (int peer = 0; peer < size(); ++peer) {
      const size_t p = static_cast<size_t>(peer);
      if (send_counts[p] > 0)
        MOE_NCCL_CHECK(
            ncclSend(send + static_cast<size_t>(send_displs[p]) * bytes,
                     static_cast<size_t>(send_counts[p]), nccl_type(type), peer, comm_, stream_),
            comm_, name());
      if (recv_counts[p] > 0)
        MOE_NCCL_CHECK(
            ncclRecv(recv + static_cast<size_t>(recv_displs[p]) * bytes,
                     static_cast<size_t>(recv_counts[p]), nccl_type(type), peer, comm_, stream_),
            comm_, name());
    }
  } catch (...) {
    ncclGroupEnd();  // NCCL's group is per thread: left open, it would swallow every later call
    throw;
  }
  MOE_NCCL_CHECK(ncclGroupEnd(), comm_, name());
}

Request NcclCommunicator::do_isend(const void* data, int64_t count, CommType type, int dest,
                                   int /*tag*/) const {
  const size_t n = element_count(count, "isend", name());
  require_device_memory(data, n * comm_type_bytes(type), "isend");
  MOE_NCCL_CHECK(ncclSend(data, n, nccl_type(type), dest, comm_, stream_), comm_, name());
  return issued_work();
}

Request NcclCommunicator::do_irecv(void* data, int64_t count, CommType type, int source,
                                   int /*tag*/) const {
  const size_t n = element_count(count, "irecv", name());
  require_device_memory(data, n * comm_type_bytes(type), "irecv");
  MOE_NCCL_CHECK(ncclRecv(data, n, nccl_type(type), source, comm_, stream_), comm_, name());
  return issued_work();
}

void NcclCommunicator::wait_if_syncing_each_op(const char* op) const {
  if (!kernels::cuda::sync_each_op() || capturing()) return;
  const cudaError_t status = cudaStreamSynchronize(stream_);
  if (status != cudaSuccess) {
    cudaGetLastError();
    nccl::fail_cuda_call(
        status, name(),
        fmt::format("{} (found by MOECORE_CUDA_SYNC_EACH_OP's wait after it)", op).c_str(),
        __FILE__, __LINE__);
  }
}

void NcclCommunicator::require_device_memory(const void* data, size_t bytes, const char* op) const {
  MOE_CHECK(bytes == 0 || !in_host_memory(data, name()),
            "[nccl] {} on group '{}': {} is host memory, and the non-blocking operations take "
            "device memory only",
            op, name(), data);
}

bool NcclCommunicator::capturing() const {
  return nccl::stream_capturing(stream_, comm_, name());
}

Request NcclCommunicator::issued_work() const {
  return capturing() ? nullptr : record_work(stream_, name());
}

void NcclCommunicator::stage(std::span<Operand> operands) const {
  size_t staged_bytes = 0;
  const bool in_capture = capturing();
  for (Operand& o : operands) {
    o.staged = o.bytes > 0 && in_host_memory(o.data, name());
    MOE_CHECK(!o.staged || !in_capture,
              "[nccl] a collective on group '{}' inside a device graph's capture was given host "
              "memory ({} bytes at {}): a captured step's collectives take device buffers",
              name(), o.bytes, o.data);
    if (o.staged)
      staged_bytes += staged_size(o.bytes);
    else
      o.device = const_cast<void*>(o.data);
  }
  if (staged_bytes == 0) return;
  char* next = static_cast<char*>(staging_buffer(staged_bytes));
  for (Operand& o : operands) {
    if (!o.staged) continue;
    o.device = next;
    next += staged_size(o.bytes);
    if (o.input)
      MOE_NCCL_CHECK(cudaMemcpyAsync(o.device, o.data, o.bytes, cudaMemcpyHostToDevice, stream_),
                     comm_, name());
  }
}

void NcclCommunicator::unstage(std::span<const Operand> operands) const {
  bool any_staged = false;
  for (const Operand& o : operands) {
    if (!o.staged) continue;
    any_staged = true;
    if (o.output)
      MOE_NCCL_CHECK(cudaMemcpyAsync(const_cast<void*>(o.data), o.device, o.bytes,
                                     cudaMemcpyDeviceToHost, stream_),
                     comm_, name());
  }
  if (any_staged) MOE_NCCL_CHECK(cudaStreamSynchronize(stream_), comm_, name());
}

void* NcclCommunicator::staging_buffer(size_t bytes) const {
  if (bytes <= staging_bytes_) return staging_;
  if (staging_ != nullptr) {
    MOE_NCCL_CHECK(cudaStreamSynchronize(stream_), comm_, name());
    MOE_NCCL_CHECK(cudaFree(staging_), comm_, name());
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  MOE_NCCL_CHECK(cudaMalloc(&staging_, bytes), comm_, name());
  staging_bytes_ = bytes;
  return staging_;
}

}  // namespace moecore::dist
