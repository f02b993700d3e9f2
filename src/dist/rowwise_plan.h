// The keep matrix of the `rowwise` expert-parallel dispatch (DESIGN.md, "Parallelism"), as pure
// arithmetic that every rank of an ep group computes identically from the all-gathered counts:
// each destination rank has a static receive capacity of ceil(capacity_factor x routes of one
// rank) rows; its buffer holds its local expert 0's rows from source 0, source 1, ..., then local
// expert 1's rows, ...; whatever lies beyond the capacity in that order is dropped (from the
// tail). Within one (source, expert) block a source's routes keep their token order, the order of
// the `sync` dispatch, so with nothing dropped the experts see the same rows in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "model/expert_exchange.h"

namespace moecore::dist {

// Rows per destination rank: ceil(capacity_factor x max_routes), where max_routes is the most
// (token, slot) routes any one rank holds. A one-line error when it does not fit an int32 row
// index or capacity_factor is not positive.
int64_t rowwise_capacity(double capacity_factor, int64_t max_routes);

struct RowwiseKeep {
  int64_t ranks = 0, local_experts = 0, capacity = 0;
  // [src * E + e] routes of source src to global expert e that are kept, and the row of the
  // first of them in the destination's buffer (the destination is e / local_experts).
  std::vector<int64_t> kept, first_row;
  // [dst * (local_experts + 1) + le] the destination's rows of its local experts < le
  // (expert-major offsets into its buffer; the last entry is the rows it receives).
  std::vector<int64_t> expert_offsets;
  int64_t routes = 0, dropped = 0;  // over the whole group
};

// requests: [ranks * E] routes each source sends to each global expert (E = ranks x
// local_experts; expert e lives on rank e / local_experts).
RowwiseKeep rowwise_keep(const std::vector<int64_t>& requests, int64_t ranks, int64_t local_experts,
                         int64_t capacity);

// Rank `rank`'s routes in route order (topk_index: [routes] the global expert of each), each
// given its destination row, or dropped; expert_offsets are `rank`'s own as a destination.
RowwisePlan rowwise_targets(const RowwiseKeep& keep, int64_t rank, const int32_t* topk_index,
                            int64_t routes);

}  // namespace moecore::dist
