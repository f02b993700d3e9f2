#include "dist/rowwise_exchange.h"

#include <algorithm>

#include "core/check.h"
#include "core/to_size.h"

namespace moecore::dist {

WindowRowwiseExchange::WindowRowwiseExchange(const Communicator& group,
                                             const Communicator& window_group,
                                             double capacity_factor)
    : group_(group), window_group_(window_group), sync_(group), capacity_factor_(capacity_factor) {
  MOE_CHECK(capacity_factor > 0.0, "[parallel] parallel.capacity_factor={} must be positive",
            capacity_factor);
  MOE_CHECK(window_group.size() >= group.size() && window_group.size() % group.size() == 0,
            "[parallel] rowwise dispatch: window group '{}' of {} ranks cannot hold ep group '{}' "
            "of {} ranks",
            window_group.name(), window_group.size(), group.name(), group.size());
  const int64_t mine = window_group.rank();
  std::vector<int64_t> ranks(to_size(group.size()));
  group.allgather(&mine, ranks.data(), 1);
  window_rank_.assign(ranks.begin(), ranks.end());
}

void WindowRowwiseExchange::exchange_counts(const std::vector<int64_t>& send,
                                            std::vector<int64_t>& recv, int64_t per_rank) const {
  sync_.exchange_counts(send, recv, per_rank);
}

void WindowRowwiseExchange::exchange_rows(const float* send, const std::vector<int64_t>& send_rows,
                                          float* recv, const std::vector<int64_t>& recv_rows,
                                          int64_t width) const {
  sync_.exchange_rows(send, send_rows, recv, recv_rows, width);
}

RowwiseKeep WindowRowwiseExchange::keep(const std::vector<int64_t>& expert_counts, int64_t routes,
                                        int64_t local_experts) const {
  const int64_t ranks = group_.size();
  const int64_t e_count = static_cast<int64_t>(expert_counts.size());
  MOE_CHECK(local_experts * ranks == e_count,
            "[parallel] rowwise dispatch: {} experts do not split into {} per rank over {} ranks",
            e_count, local_experts, ranks);

  // 1. Every rank's requests: [src][global expert], then its route count.
  const int64_t stride = e_count + 1;
  std::vector<int64_t> mine(expert_counts);
  mine.push_back(routes);
  std::vector<int64_t> all(to_size(ranks * stride));
  group_.allgather(mine.data(), all.data(), stride);
  std::vector<int64_t> requests(to_size(ranks * e_count));
  int64_t max_routes = 0;
  for (int64_t src = 0; src < ranks; ++src) {
    std::copy_n(all.begin() + src * stride, e_count, requests.begin() + src * e_count);
    max_routes = std::max(max_routes, all[to_size(src * stride + e_count)]);
  }

  // 2. The static capacity per rank from the routes of one rank (the largest, should the ranks
  // ever hold different token counts), and the keep matrix.
  return rowwise_keep(requests, ranks, local_experts,
                      rowwise_capacity(capacity_factor_, max_routes));
}

RowwiseBlocks WindowRowwiseExchange::blocks(const std::vector<int64_t>& expert_counts,
                                            int64_t routes, int64_t local_experts) const {
  const RowwiseKeep kept = keep(expert_counts, routes, local_experts);
  const int64_t ranks = kept.ranks, rank = group_.rank();
  const int64_t e_count = ranks * local_experts;
  RowwiseBlocks blocks;
  const auto mine = kept.kept.begin() + rank * e_count;
  blocks.sent.assign(mine, mine + e_count);
  blocks.received.resize(to_size(ranks * local_experts));
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < local_experts; ++le)
      blocks.received[to_size(src * local_experts + le)] =
          kept.kept[to_size(src * e_count + rank * local_experts + le)];
  for (int64_t e = 0; e < e_count; ++e)
    blocks.dropped += expert_counts[to_size(e)] - blocks.sent[to_size(e)];
  return blocks;
}

RowwisePlan WindowRowwiseExchange::plan(const std::vector<int64_t>& expert_counts,
                                        const int32_t* topk_index, int64_t routes,
                                        int64_t local_experts, int64_t width) const {
  const RowwiseKeep keep = this->keep(expert_counts, routes, local_experts);
  // Where each of my routes goes.
  RowwisePlan plan = rowwise_targets(keep, group_.rank(), topk_index, routes);

  // Fixed-size symmetric windows, grown (by every rank at once: the capacity is the same
  // everywhere) only when a dispatch needs more rows.
  int64_t floats = std::max<int64_t>(1, keep.capacity) * width;
  if (window_group_.size() > group_.size()) {  // other ep groups may need more: agree on the size
    double most = static_cast<double>(floats);
    window_group_.allreduce_max(&most, 1);
    floats = static_cast<int64_t>(most);
  }
  if (!input_ || floats > input_->size()) {
    input_.reset();  // free before allocating the larger ones
    output_.reset();
    // Counted as the ep group's traffic: the windows span the stage only for Open MPI's sake.
    input_ = window_group_.window(floats, group_.name());
    output_ = window_group_.window(floats, group_.name());
  }
  return plan;
}

void WindowRowwiseExchange::put_rows(const float* src, int64_t routes_per_row,
                                     const std::vector<RowTarget>& targets, int64_t width) const {
  input_->fence();
  const int64_t routes = static_cast<int64_t>(targets.size());
  for (int64_t r = 0; r < routes; ++r) {
    const RowTarget& t = targets[to_size(r)];
    if (t.rank < 0) continue;
    input_->put(src + (r / routes_per_row) * width, width, window_rank_[to_size(t.rank)],
                static_cast<int64_t>(t.row) * width);
  }
  input_->fence();
}

void WindowRowwiseExchange::get_rows(float* dst, const std::vector<RowTarget>& targets,
                                     int64_t width) const {
  output_->fence();
  const int64_t routes = static_cast<int64_t>(targets.size());
  for (int64_t r = 0; r < routes; ++r) {
    const RowTarget& t = targets[to_size(r)];
    if (t.rank < 0) continue;
    output_->get(dst + r * width, width, window_rank_[to_size(t.rank)],
                 static_cast<int64_t>(t.row) * width);
  }
  output_->fence();
}

}  // namespace moecore::dist
