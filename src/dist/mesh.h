// OLMo-core's process mesh. World = pp x dp: the ranks of pipeline stage s are the
// consecutive ranks [s * dp, (s + 1) * dp). Within a stage, dense parameters are replicated over
// dp and their gradients reduced over dp; the MoE mesh folds dp into (ep_dp, ep): the ep ranks of
// one group (consecutive ranks) each hold num_experts / ep experts, and the gradients of an expert
// are reduced over the ep_dp ranks that hold the same experts. Activations travel between the
// stages over `pp`, which links the ranks at the same position of every stage.
#pragma once

#include <cstdint>
#include <memory>

#include "dist/communicator.h"

namespace moecore::dist {

class Mesh {
 public:
  // Builds the groups (collective over world, which must outlive the mesh); the world size must
  // be a multiple of pp x ep. pp_world, when given, is the world the pp group is split from
  // instead (collective over it too): the same ranks in the same order over another transport,
  // for a world whose point-to-point transfers cannot carry the pipeline's (NCCL's: no tags, and
  // a posted receive holds the device's stream until its message arrives).
  static Mesh build(const Communicator& world, int64_t ep, int64_t pp = 1,
                    const Communicator* pp_world = nullptr);

  int64_t stage() const { return pp.rank(); }
  int64_t stages() const { return pp.size(); }

 private:
  // The groups, owned here; declared before the references below, which point into them.
  std::unique_ptr<Communicator> pp_, dp_, ep_, ep_dp_;

 public:
  const Communicator& world;
  const Communicator& pp;     // the same dp position in every stage; rank = stage index
                              // (split from build()'s pp_world where one was given)
  const Communicator& dp;     // this stage's data-parallel ranks (dense weights replicated)
  const Communicator& ep;     // ranks that share one copy of the experts, each holding a slice
  const Communicator& ep_dp;  // ranks that hold the same experts

 private:
  Mesh(const Communicator& world_group, std::unique_ptr<Communicator> pp_group,
       std::unique_ptr<Communicator> dp_group, std::unique_ptr<Communicator> ep_group,
       std::unique_ptr<Communicator> ep_dp_group);
};

// The shape checks of Mesh::build without MPI (`moecore plan` runs them for a world it does not
// have): pp divides the world and ep divides a stage's ranks. One-line errors naming the key.
void check_mesh_shape(int64_t world_size, int64_t ep, int64_t pp);

}  // namespace moecore::dist
