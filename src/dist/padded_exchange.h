// The `rowwise` expert-parallel dispatch's padded transport (model/expert_exchange.h's
// PaddedExchange) over a Communicator: the counts all-gathered and the blocks moved by a plain
// all-to-all, on whatever memory the group's operations take (NCCL: a GPU's, as it is; MPI: host
// memory, a device's staged through it). The keep decision is the window transport's
// (dist/rowwise_plan.h): with the same capacity factor the experts see the same rows in the same
// order, so both give the same bits.
// The blocks travel by the group's all-to-all (kAllToAll) or, where the group has one, by its
// device-initiated block exchange (kDeviceStores: a kernel stores each block into its
// destination's symmetric buffer, Communicator::device_block_exchange): the same blocks, so the
// same bits, with no send or receive posted.
// The capacity is ceil(capacity_factor x the routes of one rank), computed by each rank from its
// own routes: every rank of the group dispatches as many (micro-batches of one shape; the device
// plan checks it on the CPU backend), so all agree without asking each other.
#pragma once

#include <cstdint>
#include <memory>

#include "dist/alltoall_exchange.h"
#include "dist/communicator.h"
#include "model/expert_exchange.h"

namespace moecore::dist {

class PaddedAllToAllExchange final : public ExpertExchange, public PaddedExchange {
 public:
  enum class Blocks { kAllToAll, kDeviceStores };

  // group: the ep group. A one-line error when capacity_factor is not positive, or for
  // kDeviceStores on a group without a device-initiated exchange. Collective.
  PaddedAllToAllExchange(const Communicator& group, double capacity_factor,
                         Blocks blocks = Blocks::kAllToAll);

  int64_t ranks() const override { return group_.size(); }
  int64_t rank() const override { return group_.rank(); }
  // The sync path stays available (plain all-to-alls), though MoeBlock uses padded().
  void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                       int64_t per_rank) const override;
  void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width) const override;
  const PaddedExchange* padded() const override { return this; }

  int64_t capacity(int64_t routes) const override;
  void gather_counts(const int64_t* mine, int64_t* all, int64_t count) const override;
  void exchange_blocks(const float* send, float* recv, int64_t block_rows,
                       int64_t width) const override;

 private:
  const Communicator& group_;
  AllToAllExchange sync_;
  double capacity_factor_;
  std::unique_ptr<DeviceBlockExchange> device_stores_;  // kDeviceStores' exchange, else null
};

}  // namespace moecore::dist
