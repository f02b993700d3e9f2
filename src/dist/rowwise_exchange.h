// The `rowwise` expert-parallel dispatch (DESIGN.md, "Parallelism"; OLMo-core's production
// design) over one-sided communication into symmetric windows (dist::Window):
//   1. every rank all-gathers the per-expert route counts of the ep group;
//   2. every rank computes the same keep matrix (dist/rowwise_plan.h) against a static receive
//      capacity per rank;
//   3. each source writes every kept route's row straight into the destination's expert-major
//      input window (a put inside a fence epoch), so no receive-side permutation is needed; the
//      experts then run in place, and the sources fetch the outputs from the destination's output
//      window (a get). The backward reuses the buffers and row addresses.
// The windows are allocated once and reallocated (collectively) only when the capacity grows.
// They live on `window_group`, a group that contains the ep group (the trainer passes the stage's
// dp group): Open MPI 4.1's osc/rdma names its shared-memory segment after the communicator's
// context id, which the ep groups made by one MPI_Comm_split share, so windows on two ep groups of
// one node would silently share memory (open-mpi/ompi#9492). Every rank of window_group must
// therefore dispatch in the same order (as the data- and expert-parallel ranks of the trainer do);
// the fences span window_group.
// Rows in a device's memory cannot go through MPI's windows: there the trainer runs the sync
// dispatch in its capacity form (model/sync_dispatch.h) on blocks(), the same keep matrix, and
// the kept rows travel by all-to-all-v (exchange_rows); no window is allocated.
// A capacity_factor of at least ep guarantees that nothing is dropped; the results then equal the
// `sync` dispatch bit for bit (the experts see the same rows in the same order).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/alltoall_exchange.h"
#include "dist/communicator.h"
#include "dist/rowwise_plan.h"
#include "model/expert_exchange.h"

namespace moecore::dist {

class WindowRowwiseExchange final : public ExpertExchange, public RowwiseExchange {
 public:
  // group: the ep group; window_group: where the windows live (contains group; may equal it).
  // Collective over window_group.
  WindowRowwiseExchange(const Communicator& group, const Communicator& window_group,
                        double capacity_factor);

  int64_t ranks() const override { return group_.size(); }
  int64_t rank() const override { return group_.rank(); }
  // The sync path stays available (plain all-to-alls), though MoeBlock uses rowwise().
  void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                       int64_t per_rank) const override;
  void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width) const override;
  const RowwiseExchange* rowwise() const override { return this; }

  RowwisePlan plan(const std::vector<int64_t>& expert_counts, const int32_t* topk_index,
                   int64_t routes, int64_t local_experts, int64_t width) const override;
  float* input() const override { return input_->data(); }
  float* output() const override { return output_->data(); }
  void put_rows(const float* src, int64_t routes_per_row, const std::vector<RowTarget>& targets,
                int64_t width) const override;
  void get_rows(float* dst, const std::vector<RowTarget>& targets, int64_t width) const override;
  RowwiseBlocks blocks(const std::vector<int64_t>& expert_counts, int64_t routes,
                       int64_t local_experts) const override;

 private:
  // Every rank's requests (all-gathered) and the keep matrix against the static capacity.
  RowwiseKeep keep(const std::vector<int64_t>& expert_counts, int64_t routes,
                   int64_t local_experts) const;

  const Communicator& group_;
  const Communicator& window_group_;
  std::vector<int> window_rank_;  // [ep rank] the same process's rank in window_group
  AllToAllExchange sync_;
  double capacity_factor_;
  // Planning and the window sizes change with every dispatch; the interface is const like the
  // collectives of a Communicator.
  mutable std::unique_ptr<Window> input_, output_;
};

}  // namespace moecore::dist
