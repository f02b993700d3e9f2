// A process group (world, dp, ep, ep_dp, pp) as the model, optimizer and trainer see it, shaped
// like torch.distributed's ProcessGroup and NCCL: collectives and point-to-point transfers on
// device-neutral buffers (pointer + element count + element type), non-blocking operations that
// return a Request to wait on, sub-groups by split(), and symmetric windows for one-sided puts and
// gets (and, on GPUs that reach each other's memory, all-to-alls done by device-initiated
// stores: DeviceBlockExchange). Nothing here names a transport: src/dist/mpi/ implements it over
// MPI (a CUDA build adds NCCL beside it), and no code above src/dist/ sees an MPI type.
//
// The public operations are not virtual: they record the traffic (dist/traffic_counters.h) and
// pass the call on to the backend's do_* functions, so every backend counts bytes the same way
// and `moecore plan` can be validated against any of them. Groups of one rank move and count
// nothing. Every call is collective over the group unless it says otherwise (isend / irecv), and
// failures throw moecore::Error naming the operation and the group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moecore::dist {

// Element types that travel between ranks.
enum class CommType { kFloat32, kFloat64, kInt64, kByte };
enum class ReduceOp { kSum, kMax };

size_t comm_type_bytes(CommType type);

// A non-blocking operation in flight (an MPI request, an NCCL event; torch.distributed's Work).
class Work {
 public:
  virtual ~Work() = default;
  // Drives progress without blocking; true once the operation has completed.
  virtual bool test() = 0;
  virtual void wait() = 0;
};
// Null when nothing is left to wait for (operations of a group of one complete at once).
using Request = std::unique_ptr<Work>;

// Waits for every request and clears the list; test_all only drives their progress (MPI moves a
// non-blocking collective forward only inside a call into the library).
void wait_all(std::vector<Request>& requests);
void test_all(std::vector<Request>& requests);
// Waits for one request and resets it.
void wait(Request& request);
// True when the request has completed (or is null); completed requests are reset.
bool test(Request& request);

// The same number of floats on every rank of a group, for one-sided puts and gets inside fence
// epochs: fence(); put/get ...; fence(). Every rank of the group creates, fences and destroys its
// windows together, in the same order (MPI_Win_allocate on MPI, symmetric memory on GPUs).
class Window {
 public:
  virtual ~Window() = default;      // collective
  virtual float* data() const = 0;  // this rank's part
  virtual int64_t size() const = 0;
  // Opens or closes an access epoch on every rank; between two fences a rank touches its own part
  // only through puts and gets (and no rank reads what they change).
  virtual void fence() const = 0;
  // count floats from src into rank's part at offset; get is the reverse. Counted as traffic of
  // the window's traffic group unless `rank` is this process.
  void put(const float* src, int64_t count, int rank, int64_t offset) const;
  void get(float* dst, int64_t count, int rank, int64_t offset) const;

 protected:
  Window(int rank, std::string traffic_group)
      : rank_(rank), traffic_group_(std::move(traffic_group)) {}
  virtual void do_put(const float* src, int64_t count, int rank, int64_t offset) const = 0;
  virtual void do_get(float* dst, int64_t count, int rank, int64_t offset) const = 0;

 private:
  int rank_;  // this process's rank in the group (its own part moves nothing)
  std::string traffic_group_;
};

// An all-to-all of equal blocks of floats in a device's memory, done by one kernel per call that
// stores each block straight into its destination's symmetric receive buffer (NCCL's device API
// on GPUs that reach each other's memory by load and store): no send or receive is posted, and
// nothing waits on the host. Made by Communicator::device_block_exchange where the transport has
// one. Every rank of the group makes, uses and destroys it together, in the same order.
class DeviceBlockExchange {
 public:
  virtual ~DeviceBlockExchange() = default;  // collective
  // recv's block src [block] = rank src's send block for this rank (send, recv: size() x block
  // floats of device memory), as Communicator::alltoall(send, recv, block, kFloat32), and counted
  // as that group's all-to-all in the traffic counters. Enqueued in order with the device's work.
  void exchange(const float* send, float* recv, int64_t block) const;

 protected:
  DeviceBlockExchange(int size, std::string group) : size_(size), group_(std::move(group)) {}
  virtual void do_exchange(const float* send, float* recv, int64_t block) const = 0;
  int size() const { return size_; }
  const std::string& group() const { return group_; }

 private:
  int size_;
  std::string group_;  // the traffic counters' group
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }

  // Ranks with the same color form a new group, ordered by key. A rank that passes kNoColor
  // joins none and gets a group of one.
  static constexpr int kNoColor = -1;
  virtual std::unique_ptr<Communicator> split(int color, int key,
                                              const std::string& name) const = 0;

  virtual void barrier() const = 0;
  void allreduce(void* data, int64_t count, CommType type, ReduceOp op) const;
  // In-place, non-blocking; complete it with wait_all.
  Request iallreduce(void* data, int64_t count, CommType type, ReduceOp op) const;
  void broadcast(void* data, int64_t bytes, int root) const;
  // recv[size * count] = every rank's send[count], in rank order.
  void allgather(const void* send, void* recv, int64_t count, CommType type) const;
  // recv[count] = the reduction over ranks of send[rank() * count .. (rank() + 1) * count).
  void reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                      ReduceOp op) const;
  void alltoall(const void* send, void* recv, int64_t count_per_rank, CommType type) const;
  // Variable all-to-all; counts and displacements in elements.
  void alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, void* recv,
                 const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                 CommType type) const;
  // Non-blocking point-to-point (pipeline activations and their gradients), not collective.
  // Tags must be below max_tag().
  Request isend(const void* data, int64_t count, CommType type, int dest, int tag) const;
  Request irecv(void* data, int64_t count, CommType type, int source, int tag) const;
  virtual int max_tag() const = 0;
  // Whether the backend takes buffers in a device's memory (NCCL) or only host memory (MPI). For
  // the latter, the operations here stage device buffers through host memory: copied to the host
  // before the backend sees them and back once it is done (at wait for the non-blocking ones), as
  // torch.distributed's gloo does with CUDA tensors. Windows are never staged.
  virtual bool reaches_device_memory() const { return false; }
  // Whether its operations on device buffers are issued in order with the device's work (NCCL's
  // on the CUDA stream), so that a device graph's capture (core/device_graph.h) holds them with
  // the kernels and a replay runs them again; a non-blocking one inside a capture returns no
  // request (the device's order completes it). MPI's run on the host at the call: not capturable.
  virtual bool capturable() const { return false; }
  // A window of `count` floats on every rank; traffic_group names its puts and gets in the
  // traffic counters (default: this group's name).
  std::unique_ptr<Window> window(int64_t count, const std::string& traffic_group = "") const {
    return do_window(count, traffic_group.empty() ? name_ : traffic_group);
  }
  // The group's device-initiated all-to-all of equal blocks (collective), for a transport that has
  // one (NCCL on GPUs that reach each other by load and store); a one-line error for the others.
  std::unique_ptr<DeviceBlockExchange> device_block_exchange() const {
    return do_device_block_exchange();
  }

  // The typed forms the callers use.
  void allreduce_sum(float* data, int64_t count) const {
    allreduce(data, count, CommType::kFloat32, ReduceOp::kSum);
  }
  void allreduce_sum(double* data, int64_t count) const {
    allreduce(data, count, CommType::kFloat64, ReduceOp::kSum);
  }
  void allreduce_sum(int64_t* data, int64_t count) const {
    allreduce(data, count, CommType::kInt64, ReduceOp::kSum);
  }
  void allreduce_max(double* data, int64_t count) const {
    allreduce(data, count, CommType::kFloat64, ReduceOp::kMax);
  }
  Request iallreduce_sum(float* data, int64_t count) const {
    return iallreduce(data, count, CommType::kFloat32, ReduceOp::kSum);
  }
  void allgather(const float* send, float* recv, int64_t count) const {
    allgather(send, recv, count, CommType::kFloat32);
  }
  void allgather(const int64_t* send, int64_t* recv, int64_t count) const {
    allgather(send, recv, count, CommType::kInt64);
  }
  void reduce_scatter_sum(const float* send, float* recv, int64_t count) const {
    reduce_scatter(send, recv, count, CommType::kFloat32, ReduceOp::kSum);
  }
  void alltoall(const int64_t* send, int64_t* recv, int64_t count_per_rank) const {
    alltoall(send, recv, count_per_rank, CommType::kInt64);
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, float* recv,
                 const std::vector<int64_t>& recv_counts,
                 const std::vector<int64_t>& recv_displs) const {
    alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, CommType::kFloat32);
  }
  Request isend(const float* data, int64_t count, int dest, int tag) const {
    return isend(data, count, CommType::kFloat32, dest, tag);
  }
  Request irecv(float* data, int64_t count, int source, int tag) const {
    return irecv(data, count, CommType::kFloat32, source, tag);
  }

 protected:
  Communicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}

  // The collectives reach the backend only for groups of more than one rank; point-to-point
  // transfers and windows for any group.
  virtual void do_allreduce(void* data, int64_t count, CommType type, ReduceOp op) const = 0;
  virtual Request do_iallreduce(void* data, int64_t count, CommType type, ReduceOp op) const = 0;
  virtual void do_broadcast(void* data, int64_t bytes, int root) const = 0;
  virtual void do_allgather(const void* send, void* recv, int64_t count, CommType type) const = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                                 ReduceOp op) const = 0;
  virtual void do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                           CommType type) const = 0;
  virtual void do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, void* recv,
                            const std::vector<int64_t>& recv_counts,
                            const std::vector<int64_t>& recv_displs, CommType type) const = 0;
  virtual Request do_isend(const void* data, int64_t count, CommType type, int dest,
                           int tag) const = 0;
  virtual Request do_irecv(void* data, int64_t count, CommType type, int source, int tag) const = 0;
  virtual std::unique_ptr<Window> do_window(int64_t count,
                                            const std::string& traffic_group) const = 0;
  // Fails in one line: MPI has no device-initiated transfers.
  virtual std::unique_ptr<DeviceBlockExchange> do_device_block_exchange() const;

 private:
  int rank_;
  int size_;
  std::string name_;
};

}  // namespace moecore::dist
