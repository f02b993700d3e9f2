#include "dist/mesh.h"

#include "core/check.h"

namespace moecore::dist {

Mesh Mesh::build(const Communicator& world, int64_t ep) {
  MOE_CHECK(ep >= 1 && world.size() % ep == 0,
            "[parallel] parallel.ep={} does not divide the {} ranks of the job", ep, world.size());
  const int e = static_cast<int>(ep);
  const int rank = world.rank();
  return Mesh{world, world.split(0, rank, "dp"), world.split(rank / e, rank, "ep"),
              world.split(rank % e, rank, "ep_dp")};
}

}  // namespace moecore::dist
