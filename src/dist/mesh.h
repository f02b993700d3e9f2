// OLMo-core's process mesh on MPI. World = pp x dp (pp = 1 for now). Dense parameters are
// replicated over dp and their gradients reduced over dp. The MoE mesh folds dp into (ep_dp, ep):
// the ep ranks of one group (consecutive ranks) each hold num_experts / ep experts, and the
// gradients of an expert are reduced over the ep_dp ranks that hold the same experts.
#pragma once

#include <cstdint>

#include "dist/communicator.h"

namespace moecore::dist {

struct Mesh {
  Communicator world;
  Communicator dp;     // all data-parallel ranks (dense weights replicated)
  Communicator ep;     // ranks that share one copy of the experts, each holding a slice
  Communicator ep_dp;  // ranks that hold the same experts

  // Builds the groups; the world size must be a multiple of ep.
  static Mesh build(const Communicator& world, int64_t ep);
};

}  // namespace moecore::dist
