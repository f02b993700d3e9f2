// How token rows reach the experts. With expert parallelism the experts of a MoE layer are split
// over the `ranks()` ranks of an ep group; every rank routes its own tokens, sends each routed row
// to the rank holding its expert, and gets the expert outputs back. The model code calls this
// interface; src/dist/ implements it over MPI. One rank: rows stay where they are.
//
// Two dispatch modes (DESIGN.md, "Parallelism"): `sync` moves rows with exchange_rows (all-to-all,
// then a receive-side permutation into expert-major order); `rowwise` is the RowwiseExchange below
// (one-sided puts into symmetric windows), which an ExpertExchange offers through rowwise(), or
// its padded transport, the PaddedExchange below (padded(): the same keep decision made where the
// routing is, over an all-to-all of static blocks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace moecore {

class RowwiseExchange;
class PaddedExchange;

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int64_t ranks() const = 0;
  virtual int64_t rank() const = 0;
  // send[dst * per_rank + i] counts sent to rank dst; returns recv[src * per_rank + i] received.
  virtual void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv,
                               int64_t per_rank) const = 0;
  // Rows of `width` floats. send holds rank 0's rows, then rank 1's, ... (send_rows[dst] each);
  // recv receives src 0's rows, then src 1's, ... (recv_rows[src] each).
  virtual void exchange_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                             const std::vector<int64_t>& recv_rows, int64_t width) const = 0;
  // The one-sided row-wise dispatch when this exchange provides it (MoeBlock then uses it instead
  // of exchange_counts / exchange_rows), else nullptr.
  virtual const RowwiseExchange* rowwise() const { return nullptr; }
  // The padded transport of the row-wise dispatch when this exchange provides it (MoeBlock then
  // uses it), else nullptr.
  virtual const PaddedExchange* padded() const { return nullptr; }
};

// Where one (token, slot) route's row lives under the `rowwise` dispatch: row `row` of rank
// `rank`'s symmetric buffers, or rank = -1 when the route was dropped by the capacity limit.
struct RowTarget {
  int32_t rank = -1;
  int32_t row = 0;
};

// The result of planning one dispatch (identical keep matrix on every rank of the group).
struct RowwisePlan {
  std::vector<RowTarget> targets;       // [routes] destination of each route (t, j), in route order
  std::vector<int64_t> expert_offsets;  // [E_local + 1] this rank's rows per local expert
  int64_t dropped = 0;                  // this rank's routes dropped
};

// plan()'s keep decision by (source, expert) blocks (RowwiseExchange::blocks).
struct RowwiseBlocks {
  std::vector<int64_t> sent;      // [E] this rank's routes to each global expert that are kept
  std::vector<int64_t> received;  // [ranks * E_local] kept rows from each source per local expert
  int64_t dropped = 0;            // this rank's routes dropped
};

// The `rowwise` dispatch: every rank of the group holds two symmetric buffers of the same size,
// `input` (expert inputs in the forward, output gradients in the backward) and `output` (expert
// outputs, then input gradients). Sources write routed rows straight into the destination's
// expert-major input buffer, experts compute in place, and sources fetch their results from the
// destination's output buffer. Every call is collective over the group, in the same order on every
// rank (also on ranks with no routes).
class RowwiseExchange {
 public:
  virtual ~RowwiseExchange() = default;
  // expert_counts: [E] this rank's routes per global expert; topk_index: [routes] the global expert
  // of each route. Decides which routes are kept and where their rows go, and makes both buffers
  // hold `width` floats for every row a rank can receive.
  virtual RowwisePlan plan(const std::vector<int64_t>& expert_counts, const int32_t* topk_index,
                           int64_t routes, int64_t local_experts, int64_t width) const = 0;
  // This rank's buffers (valid until the next plan()).
  virtual float* input() const = 0;
  virtual float* output() const = 0;
  // Writes the row of route r, src[(r / routes_per_row) * width ...], to its target's input buffer,
  // for every kept route; on return this rank's input buffer holds every row sent to it.
  virtual void put_rows(const float* src, int64_t routes_per_row,
                        const std::vector<RowTarget>& targets, int64_t width) const = 0;
  // Reads dst[r * width ...] from route r's target's output buffer for every kept route (rows of
  // dropped routes are left as they are). Local writes to the output buffer made before the call
  // are what the sources read.
  virtual void get_rows(float* dst, const std::vector<RowTarget>& targets, int64_t width) const = 0;
  // The same keep decision as plan() by blocks, for rows the buffers cannot reach (device memory
  // under MPI: the sync dispatch then moves the kept rows by all-to-all-v, SyncDispatch's
  // capacity form). Needs no route indices: within each (source, expert) block the routes kept
  // are the first in token order. Collective; sizes no buffer.
  virtual RowwiseBlocks blocks(const std::vector<int64_t>& expert_counts, int64_t routes,
                               int64_t local_experts) const = 0;
};

// The `rowwise` dispatch over a padded all-to-all (model/padded_dispatch.h), for rows that no
// window reaches (a GPU without symmetric memory): the same keep decision as RowwiseExchange's,
// but made where the routing is (kernels' padded_dispatch_plan), and every size static, so that
// no pass waits for the host to read the routing. Each rank sends every rank a block of
// block_rows rows (empty slots included) and keeps at most `capacity` rows. The price is the
// padding: ranks x block_rows rows travel each way instead of the routes.
class PaddedExchange {
 public:
  virtual ~PaddedExchange() = default;
  // Rows each rank keeps when every rank of the group dispatches `routes` routes (the sizes are
  // static because every rank holds a micro-batch of the same shape): ceil(capacity_factor x
  // routes), the rowwise capacity.
  virtual int64_t capacity(int64_t routes) const = 0;
  // Rows of each (source, destination) block: as many as a pair can keep.
  int64_t block_rows(int64_t routes) const { return std::min(capacity(routes), routes); }
  // all [ranks * count] = every rank's mine [count], in rank order, where the model's tensors
  // are. Collective.
  virtual void gather_counts(const int64_t* mine, int64_t* all, int64_t count) const = 0;
  // recv's block src [block_rows, width] = rank src's send block for this rank, where the model's
  // tensors are (send and recv: [ranks * block_rows, width]). Collective.
  virtual void exchange_blocks(const float* send, float* recv, int64_t block_rows,
                               int64_t width) const = 0;
};

}  // namespace moecore
