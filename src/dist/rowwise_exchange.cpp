#include "dist/rowwise_exchange.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace moecore::dist {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

}  // namespace

MpiRowwiseExchange::MpiRowwiseExchange(const Communicator& group, const Communicator& window_group,
                                       double capacity_factor)
    : group_(group), window_group_(window_group), sync_(group), capacity_factor_(capacity_factor) {
  MOE_CHECK(capacity_factor > 0.0, "[parallel] parallel.capacity_factor={} must be positive",
            capacity_factor);
  MOE_CHECK(window_group.size() >= group.size() && window_group.size() % group.size() == 0,
            "[parallel] rowwise dispatch: window group '{}' of {} ranks cannot hold ep group '{}' "
            "of {} ranks",
            window_group.name(), window_group.size(), group.name(), group.size());
  const int64_t mine = window_group.rank();
  std::vector<int64_t> ranks(at(group.size()));
  group.allgather(&mine, ranks.data(), 1);
  window_rank_.assign(ranks.begin(), ranks.end());
}

void MpiRowwiseExchange::exchange_counts(const std::vector<int64_t>& send,
                                         std::vector<int64_t>& recv, int64_t per_rank) const {
  sync_.exchange_counts(send, recv, per_rank);
}

void MpiRowwiseExchange::exchange_rows(const float* send, const std::vector<int64_t>& send_rows,
                                       float* recv, const std::vector<int64_t>& recv_rows,
                                       int64_t width) const {
  sync_.exchange_rows(send, send_rows, recv, recv_rows, width);
}

RowwisePlan MpiRowwiseExchange::plan(const std::vector<int64_t>& expert_counts,
                                     const int32_t* topk_index, int64_t routes,
                                     int64_t local_experts, int64_t width) const {
  const int64_t ranks = group_.size(), me = group_.rank();
  const int64_t e_count = static_cast<int64_t>(expert_counts.size());
  MOE_CHECK(local_experts * ranks == e_count,
            "[parallel] rowwise dispatch: {} experts do not split into {} per rank over {} ranks",
            e_count, local_experts, ranks);

  // 1. Every rank's requests: [src][global expert], then its route count.
  const int64_t stride = e_count + 1;
  std::vector<int64_t> mine(expert_counts);
  mine.push_back(routes);
  std::vector<int64_t> all(at(ranks * stride));
  group_.allgather(mine.data(), all.data(), stride);
  int64_t max_routes = 0;
  for (int64_t src = 0; src < ranks; ++src)
    max_routes = std::max(max_routes, all[at(src * stride + e_count)]);

  // 2. Static capacity per rank from the routes of one rank (the largest, should the ranks ever
  // hold different token counts), then the keep matrix: on each destination, local-expert-major,
  // then source rank, overflow dropped from the tail. Every rank computes all of it identically.
  const double wanted = std::ceil(capacity_factor_ * static_cast<double>(max_routes));
  MOE_CHECK(wanted < static_cast<double>(std::numeric_limits<int32_t>::max()),
            "[parallel] rowwise dispatch: capacity of {} rows per rank is too large", wanted);
  const int64_t capacity = static_cast<int64_t>(wanted);
  RowwisePlan plan;
  plan.expert_offsets.assign(at(local_experts + 1), 0);
  std::vector<int64_t> base(at(e_count), 0), keep(at(e_count), 0);  // for my routes, per expert
  DropCount group_drops;
  for (int64_t dst = 0; dst < ranks; ++dst) {
    int64_t filled = 0;
    for (int64_t le = 0; le < local_experts; ++le) {
      const int64_t e = dst * local_experts + le;
      for (int64_t src = 0; src < ranks; ++src) {
        const int64_t requested = all[at(src * stride + e)];
        const int64_t kept = std::clamp<int64_t>(capacity - filled, 0, requested);
        if (src == me) {
          base[at(e)] = filled;
          keep[at(e)] = kept;
        }
        filled += kept;
        group_drops.routes += requested;
        group_drops.dropped += requested - kept;
      }
      if (dst == me) plan.expert_offsets[at(le + 1)] = filled;
    }
  }
  drop_log_.push_back(group_drops);

  // 3. Each of my routes, in token order per expert (the order of the sync dispatch), gets its row
  // in the destination's buffer, or is dropped.
  plan.targets.assign(at(routes), RowTarget{});
  std::vector<int64_t> next(at(e_count), 0);
  for (int64_t r = 0; r < routes; ++r) {
    const int64_t e = topk_index[r];
    const int64_t i = next[at(e)]++;
    if (i < keep[at(e)]) {
      plan.targets[at(r)] = {static_cast<int32_t>(e / local_experts),
                             static_cast<int32_t>(base[at(e)] + i)};
    } else {
      ++plan.dropped;
    }
  }

  // Fixed-size symmetric windows, grown (by every rank at once: the capacity is the same
  // everywhere) only when a dispatch needs more rows.
  int64_t floats = std::max<int64_t>(1, capacity) * width;
  if (window_group_.size() > group_.size()) {  // other ep groups may need more: agree on the size
    double most = static_cast<double>(floats);
    window_group_.allreduce_max(&most, 1);
    floats = static_cast<int64_t>(most);
  }
  if (floats > input_.size()) {
    input_ = FloatWindow();  // free before allocating the larger ones
    output_ = FloatWindow();
    // Counted as the ep group's traffic: the windows span the stage only for Open MPI's sake.
    input_ = FloatWindow(window_group_, floats, group_.name());
    output_ = FloatWindow(window_group_, floats, group_.name());
  }
  capacity_ = capacity;
  return plan;
}

void MpiRowwiseExchange::put_rows(const float* src, int64_t routes_per_row,
                                  const std::vector<RowTarget>& targets, int64_t width) const {
  input_.fence();
  const int64_t routes = static_cast<int64_t>(targets.size());
  for (int64_t r = 0; r < routes; ++r) {
    const RowTarget& t = targets[at(r)];
    if (t.rank < 0) continue;
    input_.put(src + (r / routes_per_row) * width, width, window_rank_[at(t.rank)],
               static_cast<int64_t>(t.row) * width);
  }
  input_.fence();
}

void MpiRowwiseExchange::get_rows(float* dst, const std::vector<RowTarget>& targets,
                                  int64_t width) const {
  output_.fence();
  const int64_t routes = static_cast<int64_t>(targets.size());
  for (int64_t r = 0; r < routes; ++r) {
    const RowTarget& t = targets[at(r)];
    if (t.rank < 0) continue;
    output_.get(dst + r * width, width, window_rank_[at(t.rank)],
                static_cast<int64_t>(t.row) * width);
  }
  output_.fence();
}

}  // namespace moecore::dist
