#include "dist/rowwise_plan.h"

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/to_size.h"
#include "kernels/padded_dispatch_rules.h"

namespace moecore::dist {

int64_t rowwise_capacity(double capacity_factor, int64_t max_routes) {
  MOE_CHECK(capacity_factor > 0.0, "[parallel] parallel.capacity_factor={} must be positive",
            capacity_factor);
  const double wanted = std::ceil(capacity_factor * static_cast<double>(max_routes));
  MOE_CHECK(wanted < static_cast<double>(std::numeric_limits<int32_t>::max()),
            "[parallel] rowwise dispatch: capacity of {} rows per rank is too large", wanted);
  return static_cast<int64_t>(wanted);
}

RowwiseKeep rowwise_keep(const std::vector<int64_t>& requests, int64_t ranks, int64_t local_experts,
                         int64_t capacity) {
  const int64_t e_count = ranks * local_experts;
  MOE_CHECK(
      ranks > 0 && local_experts > 0 && static_cast<int64_t>(requests.size()) == ranks * e_count,
      "[parallel] rowwise dispatch: {} request counts for {} ranks x {} experts", requests.size(),
      ranks, e_count);
  RowwiseKeep keep;
  keep.ranks = ranks;
  keep.local_experts = local_experts;
  keep.capacity = capacity;
  keep.kept.assign(requests.size(), 0);
  keep.first_row.assign(requests.size(), 0);
  keep.expert_offsets.assign(to_size(ranks * (local_experts + 1)), 0);
  // The walk the padded transport's device plan takes too (kernels/padded_dispatch_rules.h).
  kernels::rowwise_keep_walk(requests.data(), ranks, local_experts, capacity,
                             [&](int64_t src, int64_t e, int64_t kept, int64_t first_row) {
                               const int64_t requested = requests[to_size(src * e_count + e)];
                               keep.first_row[to_size(src * e_count + e)] = first_row;
                               keep.kept[to_size(src * e_count + e)] = kept;
                               keep.routes += requested;
                               keep.dropped += requested - kept;
                               const int64_t dst = e / local_experts, le = e % local_experts;
                               keep.expert_offsets[to_size(dst * (local_experts + 1) + le + 1)] =
                                   first_row + kept;
                             });
  return keep;
}

RowwisePlan rowwise_targets(const RowwiseKeep& keep, int64_t rank, const int32_t* topk_index,
                            int64_t routes) {
  const int64_t e_count = keep.ranks * keep.local_experts;
  RowwisePlan plan;
  const auto offsets = keep.expert_offsets.begin() + rank * (keep.local_experts + 1);
  plan.expert_offsets.assign(offsets, offsets + keep.local_experts + 1);
  plan.targets.assign(to_size(routes), RowTarget{});
  std::vector<int64_t> next(to_size(e_count), 0);
  for (int64_t r = 0; r < routes; ++r) {
    const int64_t e = topk_index[r];
    MOE_CHECK(e >= 0 && e < e_count,
              "[parallel] rowwise dispatch: route {} goes to expert {} of {}", r, e, e_count);
    const int64_t i = next[to_size(e)]++;
    if (i < keep.kept[to_size(rank * e_count + e)]) {
      plan.targets[to_size(r)] = {
          static_cast<int32_t>(e / keep.local_experts),
          static_cast<int32_t>(keep.first_row[to_size(rank * e_count + e)] + i)};
    } else {
      ++plan.dropped;
    }
  }
  return plan;
}

}  // namespace moecore::dist
