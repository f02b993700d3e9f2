#include "dist/mesh.h"

#include <utility>

#include "core/check.h"

namespace moecore::dist {

void check_mesh_shape(int64_t world_size, int64_t ep, int64_t pp) {
  MOE_CHECK(pp >= 1 && world_size % pp == 0,
            "[parallel] parallel.pp={} does not divide the {} ranks of the job", pp, world_size);
  const int64_t stage_size = world_size / pp;
  MOE_CHECK(ep >= 1 && stage_size % ep == 0,
            "[parallel] parallel.ep={} does not divide the {} ranks of a pipeline stage", ep,
            stage_size);
}

Mesh Mesh::build(const Communicator& world, int64_t ep, int64_t pp, const Communicator* pp_world) {
  check_mesh_shape(world.size(), ep, pp);
  MOE_CHECK(
      pp_world == nullptr || (pp_world->size() == world.size() && pp_world->rank() == world.rank()),
      "[parallel] the pp group's world '{}' (rank {} of {}) is not world '{}' (rank {} of {}) "
      "over another transport",
      pp_world != nullptr ? pp_world->name() : "", pp_world != nullptr ? pp_world->rank() : 0,
      pp_world != nullptr ? pp_world->size() : 0, world.name(), world.rank(), world.size());
  const int stage_size = world.size() / static_cast<int>(pp);
  const int e = static_cast<int>(ep);
  const int rank = world.rank();
  const int stage = rank / stage_size, local = rank % stage_size;
  // One split per stage rather than one split for all: Open MPI 4.1's osc/rdma names window
  // memory after the communicator's context id, which the groups of a single split share
  // (open-mpi/ompi#9492), and the rowwise dispatch puts its windows on the stage's dp group.
  std::unique_ptr<Communicator> dp;
  for (int s = 0; s < static_cast<int>(pp); ++s) {
    std::unique_ptr<Communicator> group =
        world.split(stage == s ? 0 : Communicator::kNoColor, rank, "dp");
    if (stage == s) dp = std::move(group);
  }
  std::unique_ptr<Communicator> pp_group =
      (pp_world != nullptr ? *pp_world : world).split(local, stage, "pp");
  std::unique_ptr<Communicator> ep_group = dp->split(local / e, local, "ep");
  std::unique_ptr<Communicator> ep_dp_group = dp->split(local % e, local, "ep_dp");
  return Mesh(world, std::move(pp_group), std::move(dp), std::move(ep_group),
              std::move(ep_dp_group));
}

Mesh::Mesh(const Communicator& world_group, std::unique_ptr<Communicator> pp_group,
           std::unique_ptr<Communicator> dp_group, std::unique_ptr<Communicator> ep_group,
           std::unique_ptr<Communicator> ep_dp_group)
    : pp_(std::move(pp_group)),
      dp_(std::move(dp_group)),
      ep_(std::move(ep_group)),
      ep_dp_(std::move(ep_dp_group)),
      world(world_group),
      pp(*pp_),
      dp(*dp_),
      ep(*ep_),
      ep_dp(*ep_dp_) {}

}  // namespace moecore::dist
