#include "dist/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>
#include <utility>

#include "core/check.h"

namespace moecore::dist {

namespace {

bool g_active = false;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// MPI counts are int: a message over 2^31 elements must be split by the caller (it never is here).
int as_count(int64_t count, const char* op) {
  MOE_CHECK(count >= 0 && count <= std::numeric_limits<int>::max(),
            "[mpi] {}: count {} does not fit an MPI int", op, count);
  return static_cast<int>(count);
}

void check(int code, const char* op, const std::string& group) {
  MOE_CHECK(code == MPI_SUCCESS, "[mpi] {} on group '{}' failed: {}", op, group,
            mpi_error_text(code));
}

std::map<std::string, TrafficCount>& counters() {
  static std::map<std::string, TrafficCount> table;
  return table;
}

void count_traffic(const std::string& group, const char* op, int64_t bytes) {
  TrafficCount& c = counters()[group + "." + op];
  c.bytes += bytes;
  ++c.calls;
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace

const std::map<std::string, TrafficCount>& traffic_counters() {
  return counters();
}

void reset_traffic_counters() {
  counters().clear();
}

bool init_mpi(int* argc, char*** argv) {
  if (g_active || !launched_by_mpi()) return g_active;
  int provided = 0;
  // Only the main thread calls MPI (OpenMP threads never do).
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes and become moecore::Error instead of aborting without a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_active = true;
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  return true;
}

bool mpi_active() {
  return g_active;
}

void abort_job(int exit_code) {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

Communicator::Communicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
}

Communicator Communicator::world() {
  return g_active ? Communicator(MPI_COMM_WORLD, "world") : Communicator(MPI_COMM_NULL, "world");
}

Communicator Communicator::self() {
  return Communicator(MPI_COMM_NULL, "self");
}

Communicator Communicator::split(int color, int key, const std::string& name) const {
  if (comm_ == MPI_COMM_NULL) return Communicator(MPI_COMM_NULL, name);
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", name_);
  if (sub == MPI_COMM_NULL) return Communicator(MPI_COMM_NULL, name);  // color MPI_UNDEFINED
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  return Communicator(sub, name);
}

void Communicator::barrier() const {
  if (size_ > 1) check(MPI_Barrier(comm_), "MPI_Barrier", name_);
}

void Communicator::allreduce_sum(float* data, int64_t count) const {
  if (size_ > 1) count_traffic(name_, "allreduce", count * 4);
  if (size_ > 1)
    check(
        MPI_Allreduce(MPI_IN_PLACE, data, as_count(count, "allreduce"), MPI_FLOAT, MPI_SUM, comm_),
        "MPI_Allreduce", name_);
}

MPI_Request Communicator::iallreduce_sum(float* data, int64_t count) const {
  MPI_Request request = MPI_REQUEST_NULL;
  if (size_ > 1) count_traffic(name_, "allreduce", count * 4);
  if (size_ > 1)
    check(MPI_Iallreduce(MPI_IN_PLACE, data, as_count(count, "iallreduce"), MPI_FLOAT, MPI_SUM,
                         comm_, &request),
          "MPI_Iallreduce", name_);
  return request;
}

MPI_Request Communicator::isend(const float* data, int64_t count, int dest, int tag) const {
  MPI_Request request = MPI_REQUEST_NULL;
  count_traffic(name_, "send", count * 4);
  check(MPI_Isend(data, as_count(count, "isend"), MPI_FLOAT, dest, tag, comm_, &request),
        "MPI_Isend", name_);
  return request;
}

MPI_Request Communicator::irecv(float* data, int64_t count, int source, int tag) const {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Irecv(data, as_count(count, "irecv"), MPI_FLOAT, source, tag, comm_, &request),
        "MPI_Irecv", name_);
  return request;
}

int Communicator::max_tag() const {
  if (comm_ == MPI_COMM_NULL) return 32767;  // the least MPI_TAG_UB the standard allows
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &found);
  return found != 0 ? *static_cast<int*>(value) : 32767;
}

void Communicator::wait_all(std::vector<MPI_Request>& requests) const {
  if (!g_active) {  // single process: every request is MPI_REQUEST_NULL
    requests.clear();
    return;
  }
  if (!requests.empty())
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
          "MPI_Waitall", name_);
  requests.clear();
}

void Communicator::test_all(std::vector<MPI_Request>& requests) const {
  int done = 0;
  if (g_active && !requests.empty())
    check(
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
        "MPI_Testall", name_);
}

void Communicator::allreduce_sum(double* data, int64_t count) const {
  if (size_ > 1) count_traffic(name_, "allreduce_f64", count * 8);
  if (size_ > 1)
    check(
        MPI_Allreduce(MPI_IN_PLACE, data, as_count(count, "allreduce"), MPI_DOUBLE, MPI_SUM, comm_),
        "MPI_Allreduce", name_);
}

void Communicator::allreduce_sum(int64_t* data, int64_t count) const {
  if (size_ > 1) count_traffic(name_, "allreduce_i64", count * 8);
  if (size_ > 1)
    check(MPI_Allreduce(MPI_IN_PLACE, data, as_count(count, "allreduce"), MPI_INT64_T, MPI_SUM,
                        comm_),
          "MPI_Allreduce", name_);
}

void Communicator::allreduce_max(double* data, int64_t count) const {
  if (size_ > 1) count_traffic(name_, "allreduce_max_f64", count * 8);
  if (size_ > 1)
    check(
        MPI_Allreduce(MPI_IN_PLACE, data, as_count(count, "allreduce"), MPI_DOUBLE, MPI_MAX, comm_),
        "MPI_Allreduce", name_);
}

void Communicator::broadcast(void* data, int64_t bytes, int root) const {
  if (size_ > 1 && rank_ == root) count_traffic(name_, "broadcast", bytes);
  if (size_ > 1)
    check(MPI_Bcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast", name_);
}

void Communicator::allgather(const float* send, float* recv, int64_t count) const {
  if (size_ == 1) {
    std::copy_n(send, count, recv);
    return;
  }
  count_traffic(name_, "allgather", count * 4);
  check(MPI_Allgather(send, as_count(count, "allgather"), MPI_FLOAT, recv,
                      as_count(count, "allgather"), MPI_FLOAT, comm_),
        "MPI_Allgather", name_);
}

void Communicator::allgather(const int64_t* send, int64_t* recv, int64_t count) const {
  if (size_ == 1) {
    std::copy_n(send, count, recv);
    return;
  }
  count_traffic(name_, "allgather_i64", count * 8);
  check(MPI_Allgather(send, as_count(count, "allgather"), MPI_INT64_T, recv,
                      as_count(count, "allgather"), MPI_INT64_T, comm_),
        "MPI_Allgather", name_);
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, int64_t count) const {
  if (size_ == 1) {
    std::copy_n(send, count, recv);
    return;
  }
  count_traffic(name_, "reduce_scatter", count * size_ * 4);
  check(MPI_Reduce_scatter_block(send, recv, as_count(count, "reduce_scatter"), MPI_FLOAT, MPI_SUM,
                                 comm_),
        "MPI_Reduce_scatter_block", name_);
}

void Communicator::alltoall(const int64_t* send, int64_t* recv, int64_t count_per_rank) const {
  if (size_ == 1) {
    std::copy_n(send, count_per_rank, recv);
    return;
  }
  count_traffic(name_, "alltoall_i64", count_per_rank * (size_ - 1) * 8);
  check(MPI_Alltoall(send, as_count(count_per_rank, "alltoall"), MPI_INT64_T, recv,
                     as_count(count_per_rank, "alltoall"), MPI_INT64_T, comm_),
        "MPI_Alltoall", name_);
}

void Communicator::alltoallv(const float* send, const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs, float* recv,
                             const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs) const {
  if (size_ == 1) {
    std::copy_n(send + send_displs[0], send_counts[0], recv + recv_displs[0]);
    return;
  }
  int64_t to_others = 0;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) to_others += send_counts[static_cast<size_t>(r)];
  count_traffic(name_, "alltoallv", to_others * 4);
  std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = as_count(send_counts[i], "alltoallv");
    sd[i] = as_count(send_displs[i], "alltoallv");
    rc[i] = as_count(recv_counts[i], "alltoallv");
    rd[i] = as_count(recv_displs[i], "alltoallv");
  }
  check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT,
                      comm_),
        "MPI_Alltoallv", name_);
}

FloatWindow::FloatWindow(const Communicator& group, int64_t count, const std::string& traffic_group)
    : count_(count),
      rank_(group.rank()),
      name_(group.name()),
      traffic_group_(traffic_group.empty() ? group.name() : traffic_group) {
  MOE_CHECK(group.raw() != MPI_COMM_NULL, "[mpi] a window on group '{}' needs MPI (mpirun)", name_);
  MOE_CHECK(count >= 0 && count <= std::numeric_limits<MPI_Aint>::max() /
                                       static_cast<MPI_Aint>(sizeof(float)),
            "[mpi] window of {} floats on group '{}' is too large", count, name_);
  const MPI_Aint bytes = static_cast<MPI_Aint>(count) * static_cast<MPI_Aint>(sizeof(float));
  const int code = MPI_Win_allocate(bytes, static_cast<int>(sizeof(float)), MPI_INFO_NULL,
                                    group.raw(), &data_, &win_);
  int error_class = MPI_SUCCESS;
  MPI_Error_class(code, &error_class);
  // Seen across hosts over TCP: Open MPI 4.1's osc/rdma needs an RDMA-capable transport, and
  // Debian's openmpi-mca-params.conf disables osc/pt2pt, the component that works over TCP.
  MOE_CHECK(error_class != MPI_ERR_WIN,
            "[mpi] MPI_Win_allocate on group '{}' failed: {} (no one-sided MPI component serves "
            "this transport; with Open MPI over TCP add `--mca osc pt2pt` to mpirun, or use "
            "parallel.dispatch=sync)",
            name_, mpi_error_text(code));
  check(code, "MPI_Win_allocate", name_);
  MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
}

FloatWindow::~FloatWindow() {
  release();
}

FloatWindow::FloatWindow(FloatWindow&& other) noexcept
    : win_(std::exchange(other.win_, MPI_WIN_NULL)),
      data_(std::exchange(other.data_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      rank_(other.rank_),
      name_(std::move(other.name_)),
      traffic_group_(std::move(other.traffic_group_)) {}

FloatWindow& FloatWindow::operator=(FloatWindow&& other) noexcept {
  if (this != &other) {
    release();
    win_ = std::exchange(other.win_, MPI_WIN_NULL);
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    rank_ = other.rank_;
    name_ = std::move(other.name_);
    traffic_group_ = std::move(other.traffic_group_);
  }
  return *this;
}

void FloatWindow::release() noexcept {
  // MPI_Win_free is collective: while an error unwinds this rank the others may never get there,
  // and the job is about to be ended (abort_job), so the window is left to MPI_Abort.
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
  data_ = nullptr;
  count_ = 0;
}

void FloatWindow::fence() const {
  check(MPI_Win_fence(0, win_), "MPI_Win_fence", name_);
}

void FloatWindow::put(const float* src, int64_t count, int rank, int64_t offset) const {
  if (rank != rank_) count_traffic(traffic_group_, "put", count * 4);
  check(MPI_Put(src, as_count(count, "put"), MPI_FLOAT, rank, static_cast<MPI_Aint>(offset),
                as_count(count, "put"), MPI_FLOAT, win_),
        "MPI_Put", name_);
}

void FloatWindow::get(float* dst, int64_t count, int rank, int64_t offset) const {
  if (rank != rank_) count_traffic(traffic_group_, "get", count * 4);
  check(MPI_Get(dst, as_count(count, "get"), MPI_FLOAT, rank, static_cast<MPI_Aint>(offset),
                as_count(count, "get"), MPI_FLOAT, win_),
        "MPI_Get", name_);
}

}  // namespace moecore::dist
