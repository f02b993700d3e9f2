// MPI communicators for moecore's process groups (world, dp, ep, ep_dp, pp). Every collective is a
// checked MPI call whose failure names the operation, the group and the MPI error string. When the
// process was not started by an MPI launcher (mpirun/srun), moecore runs as a single process and a
// Communicator of size 1 turns every collective into a copy or a no-op, so model and trainer code
// have one path for both cases.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moecore::dist {

// Initialises MPI when launched by mpirun/srun (detected from the launcher's environment) and
// finalises it at exit. Returns true when MPI is active.
bool init_mpi(int* argc, char*** argv);
bool mpi_active();
// Ends the whole job (every rank) after an error on one rank, so that no rank waits forever in a
// collective for a peer that has stopped.
[[noreturn]] void abort_job(int exit_code);

// Traffic this process handed to MPI since the last reset, per "group.op": the payload an
// all-reduce reduces, a reduce-scatter's whole send buffer, an all-gather's own part, the rows an
// all-to-all(v) sends to other ranks, a put's or get's rows to or from another rank, a send's
// buffer. Groups of one rank count nothing (nothing moves). Float payloads keep the plain op name
// (allreduce, reduce_scatter, allgather, alltoallv, put, get, send); statistics carry their type
// (allreduce_f64, allreduce_i64, allgather_i64, alltoall_i64, ...). `moecore plan` predicts the
// float ones (src/plan/comm_model.h). Only the main thread calls MPI, so no lock.
struct TrafficCount {
  int64_t bytes = 0;
  int64_t calls = 0;
};
const std::map<std::string, TrafficCount>& traffic_counters();
void reset_traffic_counters();

class Communicator {
 public:
  static Communicator world();
  static Communicator self();  // a group of one

  // Ranks with the same color form a new group, ordered by key.
  Communicator split(int color, int key, const std::string& name) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  MPI_Comm raw() const { return comm_; }

  void barrier() const;
  void allreduce_sum(float* data, int64_t count) const;
  // Non-blocking in-place sum; complete it with wait_all. Returns MPI_REQUEST_NULL for one rank.
  MPI_Request iallreduce_sum(float* data, int64_t count) const;
  // Waits for the requests (and clears them); test_all only drives their progress.
  void wait_all(std::vector<MPI_Request>& requests) const;
  void test_all(std::vector<MPI_Request>& requests) const;
  // Non-blocking point-to-point floats (pipeline activations and their gradients); complete with
  // wait_all. Tags must be below max_tag().
  MPI_Request isend(const float* data, int64_t count, int dest, int tag) const;
  MPI_Request irecv(float* data, int64_t count, int source, int tag) const;
  int max_tag() const;
  void allreduce_sum(double* data, int64_t count) const;
  void allreduce_sum(int64_t* data, int64_t count) const;
  void allreduce_max(double* data, int64_t count) const;
  void broadcast(void* data, int64_t bytes, int root) const;
  // recv[size * count] = every rank's send[count], in rank order.
  void allgather(const float* send, float* recv, int64_t count) const;
  void allgather(const int64_t* send, int64_t* recv, int64_t count) const;
  // recv[count] = the sum over ranks of send[rank() * count .. (rank() + 1) * count).
  void reduce_scatter_sum(const float* send, float* recv, int64_t count) const;
  void alltoall(const int64_t* send, int64_t* recv, int64_t count_per_rank) const;
  // Variable all-to-all of floats; counts and displacements in elements.
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, float* recv,
                 const std::vector<int64_t>& recv_counts,
                 const std::vector<int64_t>& recv_displs) const;

 private:
  Communicator(MPI_Comm comm, std::string name);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
};

// A window of the same number of floats on every rank of a group (MPI_Win_allocate), for one-sided
// puts and gets inside fence epochs: fence(); put/get ...; fence(). Every rank of the group must
// create, fence and destroy its windows together, in the same order. Checked calls like the
// collectives above.
class FloatWindow {
 public:
  FloatWindow() = default;
  // collective; needs an MPI group. traffic_group names the window's puts and gets in the traffic
  // counters (default: the group's name).
  FloatWindow(const Communicator& group, int64_t count, const std::string& traffic_group = "");
  ~FloatWindow();  // collective (MPI_Win_free)
  FloatWindow(FloatWindow&& other) noexcept;
  FloatWindow& operator=(FloatWindow&& other) noexcept;
  FloatWindow(const FloatWindow&) = delete;
  FloatWindow& operator=(const FloatWindow&) = delete;

  float* data() const { return data_; }  // this rank's part
  int64_t size() const { return count_; }
  // Opens or closes an access epoch on every rank (MPI_Win_fence); between two fences a rank
  // touches its own part only through puts and gets (and no rank reads what they change).
  void fence() const;
  // count floats from src into rank's part at offset (MPI_Put); get is the reverse (MPI_Get).
  void put(const float* src, int64_t count, int rank, int64_t offset) const;
  void get(float* dst, int64_t count, int rank, int64_t offset) const;

 private:
  void release() noexcept;
  MPI_Win win_ = MPI_WIN_NULL;
  float* data_ = nullptr;
  int64_t count_ = 0;
  int rank_ = 0;  // this process's rank in the group (its own part moves nothing)
  std::string name_;
  std::string traffic_group_;
};

}  // namespace moecore::dist
