// dist::Communicator over an MPI communicator. A null communicator (MPI not active, or a rank left
// out of a split) is a group of one: its collectives never reach MPI.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace moecore::dist {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name);

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) const override;
  void barrier() const override;
  int max_tag() const override;

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

 private:
  MPI_Comm comm_;
};

}  // namespace moecore::dist
