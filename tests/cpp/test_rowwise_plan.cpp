// The rowwise dispatch's keep matrix (dist/rowwise_plan.h), pure arithmetic checked without any
// communicator: against a route-by-route oracle that fills each destination's buffer in the
// documented order (local expert, then source rank, then the source's token order) and drops
// whatever lies beyond the capacity; plus the edge cases (no tokens, every token to one expert,
// overflow, enough capacity for no drop) and the one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "dist/rowwise_plan.h"
#include "kernels/ops.h"

namespace moecore::dist {
namespace {

// Every rank's routes: [src] the global expert of each of its (token, slot) routes, in order.
using Routes = std::vector<std::vector<int32_t>>;

std::vector<int64_t> request_counts(const Routes& routes, int64_t experts) {
  std::vector<int64_t> requests(routes.size() * static_cast<size_t>(experts), 0);
  for (size_t src = 0; src < routes.size(); ++src)
    for (int32_t e : routes[src]) ++requests[src * static_cast<size_t>(experts) + e];
  return requests;
}

int64_t max_routes(const Routes& routes) {
  int64_t most = 0;
  for (const auto& r : routes) most = std::max(most, static_cast<int64_t>(r.size()));
  return most;
}

// The oracle: walk each destination's buffer row by row.
struct Oracle {
  std::vector<RowwisePlan> plans;  // [src]
  int64_t dropped = 0;
};

Oracle fill_buffers(const Routes& routes, int64_t local_experts, int64_t capacity) {
  const int64_t ranks = static_cast<int64_t>(routes.size());
  Oracle o;
  o.plans.resize(routes.size());
  for (size_t src = 0; src < routes.size(); ++src)
    o.plans[src].targets.assign(routes[src].size(), RowTarget{});
  for (int64_t dst = 0; dst < ranks; ++dst) {
    RowwisePlan& mine = o.plans[static_cast<size_t>(dst)];
    mine.expert_offsets.assign(static_cast<size_t>(local_experts + 1), 0);
    int32_t row = 0;
    for (int64_t le = 0; le < local_experts; ++le) {
      const int64_t e = dst * local_experts + le;
      for (size_t src = 0; src < routes.size(); ++src)
        for (size_t r = 0; r < routes[src].size(); ++r) {
          if (routes[src][r] != e) continue;
          if (row < capacity) {
            o.plans[src].targets[r] = {static_cast<int32_t>(dst), row++};
          } else {
            ++o.plans[src].dropped;
            ++o.dropped;
          }
        }
      mine.expert_offsets[static_cast<size_t>(le + 1)] = row;
    }
  }
  return o;
}

void expect_matches_oracle(const Routes& routes, int64_t local_experts, double capacity_factor) {
  const int64_t ranks = static_cast<int64_t>(routes.size());
  const int64_t experts = ranks * local_experts;
  const int64_t capacity = rowwise_capacity(capacity_factor, max_routes(routes));
  const RowwiseKeep keep =
      rowwise_keep(request_counts(routes, experts), ranks, local_experts, capacity);
  const Oracle oracle = fill_buffers(routes, local_experts, capacity);
  int64_t all_routes = 0;
  for (const auto& r : routes) all_routes += static_cast<int64_t>(r.size());
  EXPECT_EQ(keep.routes, all_routes);
  EXPECT_EQ(keep.dropped, oracle.dropped);
  for (int64_t src = 0; src < ranks; ++src) {
    const auto& mine = routes[static_cast<size_t>(src)];
    const RowwisePlan plan =
        rowwise_targets(keep, src, mine.data(), static_cast<int64_t>(mine.size()));
    const RowwisePlan& want = oracle.plans[static_cast<size_t>(src)];
    EXPECT_EQ(plan.expert_offsets, want.expert_offsets) << "rank " << src;
    EXPECT_EQ(plan.dropped, want.dropped) << "rank " << src;
    ASSERT_EQ(plan.targets.size(), want.targets.size());
    for (size_t r = 0; r < plan.targets.size(); ++r) {
      EXPECT_EQ(plan.targets[r].rank, want.targets[r].rank) << "rank " << src << " route " << r;
      EXPECT_EQ(plan.targets[r].row, want.targets[r].row) << "rank " << src << " route " << r;
    }
  }
}

Routes random_routes(int64_t ranks, int64_t experts, int64_t routes_per_rank, bool skewed,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  // Skewed: a quarter of the experts draw most routes (a capacity of 1.25 overflows there).
  std::discrete_distribution<int32_t> pick = [&] {
    std::vector<double> weights(static_cast<size_t>(experts), 1.0);
    if (skewed)
      for (int64_t e = 0; e < experts; e += 4) weights[static_cast<size_t>(e)] = 12.0;
    return std::discrete_distribution<int32_t>(weights.begin(), weights.end());
  }();
  Routes routes(static_cast<size_t>(ranks));
  for (auto& r : routes)
    for (int64_t i = 0; i < routes_per_rank; ++i) r.push_back(pick(rng));
  return routes;
}

// The padded transport's device plan (kernels' padded_dispatch_plan, run here by the CPU
// backend) for every rank of the group: each kept route lands, through its send slot and the
// destination's received slot, on the row the oracle gives it; dropped routes travel nowhere;
// each rank's expert offsets and drops are the oracle's; every received slot that holds a row
// and every row maps back to the other.
void expect_padded_plan_matches_oracle(const Routes& routes, int64_t local_experts,
                                       double capacity_factor) {
  const int64_t ranks = static_cast<int64_t>(routes.size());
  const int64_t experts = ranks * local_experts;
  const int64_t most = max_routes(routes);
  const int64_t capacity = rowwise_capacity(capacity_factor, most);
  const int64_t block = std::min(capacity, most);
  const Oracle oracle = fill_buffers(routes, local_experts, capacity);
  std::vector<int64_t> requests = request_counts(routes, experts);
  struct Maps {
    std::vector<int32_t> order;  // each route's position
    std::vector<int32_t> slot_of_position, position_of_slot, token_of_slot, row_of_slot,
        slot_of_row;
    std::vector<int64_t> offsets, dropped;
  };
  std::vector<Maps> maps(routes.size());
  for (int64_t rank = 0; rank < ranks; ++rank) {
    std::vector<int32_t> mine = routes[static_cast<size_t>(rank)];
    const int64_t n = static_cast<int64_t>(mine.size());
    Maps& m = maps[static_cast<size_t>(rank)];
    std::vector<int32_t>& order = m.order;
    order.resize(mine.size());
    std::vector<int64_t> starts(static_cast<size_t>(experts + 1));
    kernels::order_routes_by_expert(view(mine.data(), {n, 1}), experts, view(order.data(), {n}),
                                    view(starts.data(), {experts + 1}));
    m.slot_of_position.resize(mine.size());
    m.position_of_slot.resize(static_cast<size_t>(ranks * block));
    m.token_of_slot.resize(m.position_of_slot.size());
    m.row_of_slot.resize(m.position_of_slot.size());
    m.slot_of_row.resize(static_cast<size_t>(capacity));
    m.offsets.resize(static_cast<size_t>(local_experts + 1));
    m.dropped.resize(1);
    kernels::padded_dispatch_plan(
        view(requests.data(), {ranks, experts}), view(mine.data(), {n, 1}), view(order.data(), {n}),
        view(starts.data(), {experts + 1}), {rank, ranks, local_experts, capacity, block},
        {view(m.slot_of_position.data(), {n}), view(m.position_of_slot.data(), {ranks * block}),
         view(m.token_of_slot.data(), {ranks * block}), view(m.row_of_slot.data(), {ranks * block}),
         view(m.slot_of_row.data(), {capacity}), view(m.offsets.data(), {local_experts + 1}),
         view(m.dropped.data(), {1})});
    const RowwisePlan& want = oracle.plans[static_cast<size_t>(rank)];
    EXPECT_EQ(m.offsets, want.expert_offsets) << "rank " << rank;
    EXPECT_EQ(m.dropped[0], want.dropped) << "rank " << rank;
  }
  for (int64_t src = 0; src < ranks; ++src) {
    const Maps& m = maps[static_cast<size_t>(src)];
    const RowwisePlan& want = oracle.plans[static_cast<size_t>(src)];
    for (size_t r = 0; r < m.slot_of_position.size(); ++r) {
      const int32_t position = m.order[r];
      const int32_t slot = m.slot_of_position[static_cast<size_t>(position)];
      if (want.targets[r].rank < 0) {
        EXPECT_EQ(slot, -1) << "rank " << src << " route " << r << " is dropped";
        continue;
      }
      ASSERT_GE(slot, 0) << "rank " << src << " route " << r;
      EXPECT_EQ(m.position_of_slot[static_cast<size_t>(slot)], position);
      EXPECT_EQ(m.token_of_slot[static_cast<size_t>(slot)], static_cast<int32_t>(r));  // k = 1
      const int64_t dst = slot / block;
      EXPECT_EQ(dst, want.targets[r].rank) << "rank " << src << " route " << r;
      const Maps& at = maps[static_cast<size_t>(dst)];
      const int64_t received = src * block + slot % block;
      EXPECT_EQ(at.row_of_slot[static_cast<size_t>(received)], want.targets[r].row)
          << "rank " << src << " route " << r;
    }
  }
  for (int64_t dst = 0; dst < ranks; ++dst) {
    const Maps& m = maps[static_cast<size_t>(dst)];
    int64_t rows = 0;
    for (size_t q = 0; q < m.row_of_slot.size(); ++q)
      if (m.row_of_slot[q] >= 0) {
        ++rows;
        EXPECT_EQ(m.slot_of_row[static_cast<size_t>(m.row_of_slot[q])], static_cast<int32_t>(q));
      }
    EXPECT_EQ(rows, m.offsets.back()) << "rank " << dst << " receives each kept row once";
    for (size_t row = 0; row < m.slot_of_row.size(); ++row)
      EXPECT_EQ(m.slot_of_row[row] >= 0, static_cast<int64_t>(row) < m.offsets.back()) << row;
  }
}

TEST(RowwisePlan, PaddedTransportPlansTheSameRowsOnTheDevice) {
  uint32_t seed = 100;
  for (int64_t ranks : {1, 2, 3, 4})
    for (int64_t local : {1, 2, 3})
      for (bool skewed : {false, true})
        for (double factor : {0.5, 1.0, 1.25, 4.0}) {
          SCOPED_TRACE("ranks " + std::to_string(ranks) + " local experts " +
                       std::to_string(local) + " factor " + std::to_string(factor) +
                       (skewed ? " skewed" : " uniform"));
          expect_padded_plan_matches_oracle(random_routes(ranks, ranks * local, 24, skewed, seed++),
                                            local, factor);
        }
  // No routes anywhere; every route to one expert.
  expect_padded_plan_matches_oracle(Routes(3), 2, 1.25);
  expect_padded_plan_matches_oracle({std::vector<int32_t>(8, 0), std::vector<int32_t>(8, 0)}, 2,
                                    1.25);
}

TEST(RowwisePlan, CapacityIsTheCeilingOfFactorTimesTheLargestRank) {
  EXPECT_EQ(rowwise_capacity(1.25, 8), 10);
  EXPECT_EQ(rowwise_capacity(1.25, 9), 12);  // 11.25 rounds up
  EXPECT_EQ(rowwise_capacity(1.0, 7), 7);
  EXPECT_EQ(rowwise_capacity(1.25, 0), 0);
}

TEST(RowwisePlan, ZeroTokensKeepNothingAndDropNothing) {
  const Routes routes(4);  // four ranks, no routes anywhere
  const RowwiseKeep keep = rowwise_keep(request_counts(routes, 8), 4, 2, rowwise_capacity(1.25, 0));
  EXPECT_EQ(keep.capacity, 0);
  EXPECT_EQ(keep.routes, 0);
  EXPECT_EQ(keep.dropped, 0);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const RowwisePlan plan = rowwise_targets(keep, rank, nullptr, 0);
    EXPECT_TRUE(plan.targets.empty());
    EXPECT_EQ(plan.dropped, 0);
    EXPECT_EQ(plan.expert_offsets, std::vector<int64_t>(3, 0));
  }
}

TEST(RowwisePlan, AllTokensToOneExpertFillItsRankAndDropTheTail) {
  // Two ranks of 8 routes each, all to expert 0 (rank 0's first local expert); capacity
  // ceil(1.25 * 8) = 10: source 0's 8 rows, then the first 2 of source 1's; 6 dropped.
  const Routes routes{std::vector<int32_t>(8, 0), std::vector<int32_t>(8, 0)};
  const RowwiseKeep keep = rowwise_keep(request_counts(routes, 4), 2, 2, rowwise_capacity(1.25, 8));
  EXPECT_EQ(keep.capacity, 10);
  EXPECT_EQ(keep.routes, 16);
  EXPECT_EQ(keep.dropped, 6);
  const RowwisePlan first = rowwise_targets(keep, 0, routes[0].data(), 8);
  const RowwisePlan second = rowwise_targets(keep, 1, routes[1].data(), 8);
  EXPECT_EQ(first.dropped, 0);
  EXPECT_EQ(second.dropped, 6);
  for (int32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(first.targets[static_cast<size_t>(r)].rank, 0);
    EXPECT_EQ(first.targets[static_cast<size_t>(r)].row, r);
  }
  EXPECT_EQ(second.targets[0].row, 8);
  EXPECT_EQ(second.targets[1].row, 9);
  for (size_t r = 2; r < 8; ++r) EXPECT_EQ(second.targets[r].rank, -1) << r;  // the tail
  EXPECT_EQ(first.expert_offsets, (std::vector<int64_t>{0, 10, 10}));         // rank 0 receives all
  EXPECT_EQ(second.expert_offsets, (std::vector<int64_t>{0, 0, 0}));          // rank 1 nothing
  expect_matches_oracle(routes, 2, 1.25);
}

TEST(RowwisePlan, OverflowDropsWhatTheBufferOrderPutsLast) {
  uint32_t seed = 1;
  for (int64_t ranks : {1, 2, 3, 4})
    for (int64_t local : {1, 2, 3})
      for (bool skewed : {false, true})
        for (double factor : {0.5, 1.0, 1.25}) {
          SCOPED_TRACE("ranks " + std::to_string(ranks) + " local experts " +
                       std::to_string(local) + " factor " + std::to_string(factor) +
                       (skewed ? " skewed" : " uniform"));
          expect_matches_oracle(random_routes(ranks, ranks * local, 24, skewed, seed++), local,
                                factor);
        }
}

TEST(RowwisePlan, FactorOfRanksNeverDropsAndFillsEachBufferExactly) {
  // Every route of the group can land on one rank only if the capacity is ranks x routes.
  for (int64_t ranks : {2, 4}) {
    const Routes routes = random_routes(ranks, ranks * 2, 32, /*skewed=*/true, 7);
    const int64_t capacity = rowwise_capacity(static_cast<double>(ranks), 32);
    const RowwiseKeep keep = rowwise_keep(request_counts(routes, ranks * 2), ranks, 2, capacity);
    EXPECT_EQ(keep.dropped, 0);
    // The rows of each destination are 0 .. received - 1, each written by exactly one route.
    std::vector<std::set<int32_t>> rows(static_cast<size_t>(ranks));
    for (int64_t src = 0; src < ranks; ++src) {
      const auto& mine = routes[static_cast<size_t>(src)];
      const RowwisePlan plan = rowwise_targets(keep, src, mine.data(), 32);
      for (const RowTarget& t : plan.targets) {
        ASSERT_GE(t.rank, 0);
        EXPECT_TRUE(rows[static_cast<size_t>(t.rank)].insert(t.row).second) << "row written twice";
      }
    }
    for (int64_t dst = 0; dst < ranks; ++dst) {
      const int64_t received = keep.expert_offsets[static_cast<size_t>(dst * 3 + 2)];
      EXPECT_EQ(static_cast<int64_t>(rows[static_cast<size_t>(dst)].size()), received);
      if (received > 0) {
        EXPECT_EQ(*rows[static_cast<size_t>(dst)].rbegin(), received - 1);
      }
    }
    expect_matches_oracle(routes, 2, static_cast<double>(ranks));
  }
}

TEST(RowwisePlan, BadInputIsAOneLineError) {
  EXPECT_THROW(rowwise_capacity(0.0, 8), Error);
  EXPECT_THROW(rowwise_capacity(1e12, 1 << 20), Error);
  EXPECT_THROW(rowwise_keep({1, 2, 3}, 2, 2, 4), Error);  // 3 counts for 2 ranks x 4 experts
  const RowwiseKeep keep = rowwise_keep(std::vector<int64_t>(4, 0), 2, 1, 4);
  const int32_t out_of_range = 2;
  EXPECT_THROW(rowwise_targets(keep, 0, &out_of_range, 1), Error);
}

}  // namespace
}  // namespace moecore::dist
