// dist::Communicator in a single process (no mpirun): the world is a group of one whose
// collectives leave or copy the caller's data, move and count nothing, and whose splits are groups
// of one again; one-sided windows need a launcher and say so in one line. The multi-rank behaviour
// is checked under mpirun (tests/train/test_parallel.py, test_plan_traffic.py).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "dist/communicator.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "dist/traffic_counters.h"

namespace moecore::dist {
namespace {

TEST(Communicator, GroupOfOneKeepsOrCopiesDataAndCountsNothing) {
  ASSERT_FALSE(mpi_active()) << "run this test without mpirun";
  const std::unique_ptr<Communicator> world = mpi_world();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
  reset_traffic_counters();
  std::vector<float> values{1.5f, -2.0f};
  world->allreduce_sum(values.data(), 2);
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f}));
  std::vector<Request> pending;
  pending.push_back(world->iallreduce_sum(values.data(), 2));
  EXPECT_EQ(pending.back(), nullptr);  // nothing to wait for
  wait_all(pending);
  EXPECT_TRUE(pending.empty());
  const std::vector<int64_t> send{3, 4};
  std::vector<int64_t> gathered(2), exchanged(2);
  world->allgather(send.data(), gathered.data(), 2);
  world->alltoall(send.data(), exchanged.data(), 2);
  EXPECT_EQ(gathered, send);
  EXPECT_EQ(exchanged, send);
  std::vector<float> scattered(2), moved(3, 0.0f);
  world->reduce_scatter_sum(values.data(), scattered.data(), 2);
  EXPECT_EQ(scattered, values);
  world->alltoallv(values.data(), {2}, {0}, moved.data(), {2}, {1});
  EXPECT_EQ(moved, (std::vector<float>{0.0f, 1.5f, -2.0f}));
  EXPECT_TRUE(traffic_counters().empty());
}

TEST(Communicator, MeshOfOneProcessIsGroupsOfOne) {
  const std::unique_ptr<Communicator> world = mpi_world();
  const Mesh mesh = Mesh::build(*world, 1, 1);
  for (const Communicator* group : {&mesh.pp, &mesh.dp, &mesh.ep, &mesh.ep_dp}) {
    EXPECT_EQ(group->size(), 1) << group->name();
    EXPECT_EQ(group->rank(), 0) << group->name();
  }
  EXPECT_EQ(mesh.dp.name(), "dp");
  EXPECT_EQ(mesh.ep_dp.name(), "ep_dp");
  EXPECT_EQ(mesh.stages(), 1);
  EXPECT_THROW(Mesh::build(*world, 2, 1), Error);  // ep 2 does not divide one rank
}

TEST(Communicator, WindowWithoutLauncherIsAOneLineError) {
  const std::unique_ptr<Communicator> world = mpi_world();
  try {
    (void)world->window(16);
    FAIL() << "a window needs MPI";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs MPI (mpirun)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moecore::dist
