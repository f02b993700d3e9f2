#include "dist/padded_exchange.h"

#include "core/check.h"
#include "dist/rowwise_plan.h"

namespace moecore::dist {

PaddedAllToAllExchange::PaddedAllToAllExchange(const Communicator& group, double capacity_factor,
                                               Blocks blocks)
    : group_(group), sync_(group), capacity_factor_(capacity_factor) {
  MOE_CHECK(capacity_factor > 0.0, "[parallel] parallel.capacity_factor={} must be positive",
            capacity_factor);
  if (blocks == Blocks::kDeviceStores) device_stores_ = group.device_block_exchange();
}

int64_t PaddedAllToAllExchange::capacity(int64_t routes) const {
  return rowwise_capacity(capacity_factor_, routes);
}

void PaddedAllToAllExchange::exchange_counts(const std::vector<int64_t>& send,
                                             std::vector<int64_t>& recv, int64_t per_rank) const {
  sync_.exchange_counts(send, recv, per_rank);
}

void PaddedAllToAllExchange::exchange_rows(const float* send, const std::vector<int64_t>& send_rows,
                                           float* recv, const std::vector<int64_t>& recv_rows,
                                           int64_t width) const {
  sync_.exchange_rows(send, send_rows, recv, recv_rows, width);
}

void PaddedAllToAllExchange::gather_counts(const int64_t* mine, int64_t* all, int64_t count) const {
  group_.allgather(mine, all, count);
}

void PaddedAllToAllExchange::exchange_blocks(const float* send, float* recv, int64_t block_rows,
                                             int64_t width) const {
  if (device_stores_ != nullptr)
    device_stores_->exchange(send, recv, block_rows * width);
  else
    group_.alltoall(send, recv, block_rows * width, CommType::kFloat32);
}

}  // namespace moecore::dist
