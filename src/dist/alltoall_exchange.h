// The `sync` expert-parallel dispatch: an all-to-all of per-expert row counts, then an
// all-to-all-v of the token rows, over the ep group (MPI_Alltoall / MPI_Alltoallv).
#pragma once

#include "dist/communicator.h"
#include "model/expert_exchange.h"

namespace moecore::dist {

class AllToAllExchange final : public ExpertExchange {
 public:
  explicit AllToAllExchange(const Communicator& group) : group_(group) {}

  int64_t ranks() const override { return group_.size(); }
  int64_t rank() const override { return group_.rank(); }
  void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                       int64_t per_rank) const override;
  void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width) const override;

 private:
  const Communicator& group_;
};

}  // namespace moecore::dist
