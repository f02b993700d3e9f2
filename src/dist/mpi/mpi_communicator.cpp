#include "dist/mpi/mpi_communicator.h"

#include <utility>

#include "core/check.h"
#include "dist/mpi/mpi_check.h"
#include "dist/mpi/mpi_window.h"

namespace moecore::dist {

namespace {

int rank_in(MPI_Comm comm) {
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &size);
  return size;
}

// A pending MPI request; its failure names the group it was posted on.
class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, const std::string& group) : request_(request), group_(group) {}
  bool test() override {
    int done = 0;
    mpi::check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test", group_);
    return done != 0;
  }
  void wait() override { mpi::check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait", group_); }

 private:
  MPI_Request request_;
  std::string group_;
};

}  // namespace

// The communicators are never freed (MPI_Comm_free is collective, and the groups live as long as
// the job).
MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : Communicator(rank_in(comm), size_of(comm), std::move(name)), comm_(comm) {}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key,
                                                     const std::string& name) const {
  if (comm_ == MPI_COMM_NULL) return std::make_unique<MpiCommunicator>(MPI_COMM_NULL, name);
  MPI_Comm sub = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split(comm_, color == kNoColor ? MPI_UNDEFINED : color, key, &sub),
             "MPI_Comm_split", this->name());
  if (sub != MPI_COMM_NULL) MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(sub, name);
}

void MpiCommunicator::barrier() const {
  if (size() > 1) mpi::check(MPI_Barrier(comm_), "MPI_Barrier", name());
}

int MpiCommunicator::max_tag() const {
  if (comm_ == MPI_COMM_NULL) return 32767;  // the least MPI_TAG_UB the standard allows
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &found);
  return found != 0 ? *static_cast<int*>(value) : 32767;
}

std::unique_ptr<Window> MpiCommunicator::do_window(int64_t count,
                                                   const std::string& traffic_group) const {
  MOE_CHECK(comm_ != MPI_COMM_NULL, "[mpi] a window on group '{}' needs MPI (mpirun)", name());
  return std::make_unique<MpiWindow>(comm_, rank(), name(), count, traffic_group);
}

void MpiCommunicator::do_allreduce(void* data, int64_t count, CommType type, ReduceOp op) const {
  mpi::check(MPI_Allreduce(MPI_IN_PLACE, data, mpi::as_count(count, "allreduce"),
                           mpi::datatype(type), mpi::reduction(op), comm_),
             "MPI_Allreduce", name());
}

Request MpiCommunicator::do_iallreduce(void* data, int64_t count, CommType type,
                                       ReduceOp op) const {
  MPI_Request request = MPI_REQUEST_NULL;
  mpi::check(MPI_Iallreduce(MPI_IN_PLACE, data, mpi::as_count(count, "iallreduce"),
                            mpi::datatype(type), mpi::reduction(op), comm_, &request),
             "MPI_Iallreduce", name());
  return std::make_unique<MpiWork>(request, name());
}

void MpiCommunicator::do_broadcast(void* data, int64_t bytes, int root) const {
  mpi::check(MPI_Bcast(data, mpi::as_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast",
             name());
}

void MpiCommunicator::do_allgather(const void* send, void* recv, int64_t count,
                                   CommType type) const {
  const int n = mpi::as_count(count, "allgather");
  mpi::check(MPI_Allgather(send, n, mpi::datatype(type), recv, n, mpi::datatype(type), comm_),
             "MPI_Allgather", name());
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, int64_t count, CommType type,
                                        ReduceOp op) const {
  mpi::check(MPI_Reduce_scatter_block(send, recv, mpi::as_count(count, "reduce_scatter"),
                                      mpi::datatype(type), mpi::reduction(op), comm_),
             "MPI_Reduce_scatter_block", name());
}

void MpiCommunicator::do_alltoall(const void* send, void* recv, int64_t count_per_rank,
                                  CommType type) const {
  const int n = mpi::as_count(count_per_rank, "alltoall");
  mpi::check(MPI_Alltoall(send, n, mpi::datatype(type), recv, n, mpi::datatype(type), comm_),
             "MPI_Alltoall", name());
}

void MpiCommunicator::do_alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                   const std::vector<int64_t>& send_displs, void* recv,
                                   const std::vector<int64_t>& recv_counts,
                                   const std::vector<int64_t>& recv_displs, CommType type) const {
  std::vector<int> sc(static_cast<size_t>(size())), sd(sc.size()), rc(sc.size()), rd(sc.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = mpi::as_count(send_counts[i], "alltoallv");
    sd[i] = mpi::as_count(send_displs[i], "alltoallv");
    rc[i] = mpi::as_count(recv_counts[i], "alltoallv");
    rd[i] = mpi::as_count(recv_displs[i], "alltoallv");
  }
  mpi::check(MPI_Alltoallv(send, sc.data(), sd.data(), mpi::datatype(type), recv, rc.data(),
                           rd.data(), mpi::datatype(type), comm_),
             "MPI_Alltoallv", name());
}

Request MpiCommunicator::do_isend(const void* data, int64_t count, CommType type, int dest,
                                  int tag) const {
  MPI_Request request = MPI_REQUEST_NULL;
  mpi::check(MPI_Isend(data, mpi::as_count(count, "isend"), mpi::datatype(type), dest, tag, comm_,
                       &request),
             "MPI_Isend", name());
  return std::make_unique<MpiWork>(request, name());
}

Request MpiCommunicator::do_irecv(void* data, int64_t count, CommType type, int source,
                                  int tag) const {
  MPI_Request request = MPI_REQUEST_NULL;
  mpi::check(MPI_Irecv(data, mpi::as_count(count, "irecv"), mpi::datatype(type), source, tag, comm_,
                       &request),
             "MPI_Irecv", name());
  return std::make_unique<MpiWork>(request, name());
}

}  // namespace moecore::dist
