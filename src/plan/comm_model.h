// Bytes each collective moves per optimizer step, per rank of pipeline stage `stage`, as the
// payload this rank hands to its communicator (what dist/traffic_counters.h records): an all-reduce
// counts its buffer, a reduce-scatter its whole send buffer, an all-gather this rank's part, an
// all-to-all(v) and one-sided puts/gets the rows bound for (or fetched from) other ranks, a
// pipeline send its hidden state. Groups of one rank move nothing. Token routing is planned
// balanced (routing = "balanced" makes it exact; it is the expectation under random routing).
// Only the data plane is modelled: the small statistics reductions (losses, norms, counts) are not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

struct CollectiveBytes {
  std::string group;  // dp, ep_dp, ep, pp (the mesh's names)
  std::string op;     // allreduce, reduce_scatter, allgather, alltoallv, put, get, send
  std::string what;   // what travels
  double bytes = 0.0;
};

std::vector<CollectiveBytes> rank_collectives(const RunConfig& config, const ResolvedLayout& layout,
                                              int64_t stage);

}  // namespace moecore::plan
