// parallel.communicator (train/communicator_choice.h): the key read, validated and written back;
// what "auto" picks for the host and for a device with and without a communicator registered for
// its memory (dist/device_communicators.h; a stand-in here, NCCL's needs a GPU: tests/cuda), and
// the one-line refusals of "nccl" where it cannot be used.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "dist/device_communicators.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "train/communicator_choice.h"
#include "train/run_config.h"

namespace moecore {
namespace {

std::unique_ptr<dist::Communicator> never_called(const dist::Communicator& /*bootstrap*/,
                                                 const std::string& /*group*/) {
  throw Error("[test] the choice must not create a communicator");
}
constexpr dist::DeviceCommunicatorFactory kNccl{.name = "nccl", .create = &never_called};
constexpr dist::DeviceCommunicatorFactory kOther{.name = "rccl", .create = &never_called};

// Registers `factory` for CUDA memory for the scope's lifetime (nullptr: none).
class Registered {
 public:
  explicit Registered(const dist::DeviceCommunicatorFactory* factory)
      : previous_(dist::device_communicator(Device::kCuda)) {
    dist::register_device_communicator(Device::kCuda, factory);
  }
  ~Registered() { dist::register_device_communicator(Device::kCuda, previous_); }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;

 private:
  const dist::DeviceCommunicatorFactory* previous_;
};

RunConfig config(const std::vector<std::string>& overrides) {
  return parse_run_config("", "test.toml", overrides);
}

// The choice for a job of `ranks` whose factory says `why` it cannot serve them ("": it can);
// counts how often it was asked.
int g_asked = 0;
CommunicatorChoice choose(const RunConfig& c, int64_t ranks, const std::string& why = "") {
  return choose_communicator(c, ranks, [&why](const dist::DeviceCommunicatorFactory&) {
    ++g_asked;
    return why;
  });
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CommunicatorChoice, KeyIsReadValidatedAndWrittenBack) {
  EXPECT_EQ(config({}).parallel.communicator, CommunicatorKind::kAuto);
  EXPECT_EQ(config({"parallel.communicator=mpi"}).parallel.communicator, CommunicatorKind::kMpi);
  EXPECT_EQ(config({"parallel.communicator=nccl"}).parallel.communicator, CommunicatorKind::kNccl);
  const std::string e = error_of([] { config({"parallel.communicator=gloo"}); });
  EXPECT_NE(e.find("parallel.communicator=\"gloo\" is not one of \"auto\", \"mpi\", \"nccl\""),
            std::string::npos)
      << e;
  for (const char* kind : {"auto", "mpi", "nccl"}) {
    const RunConfig c = config({std::string("parallel.communicator=") + kind});
    const std::string toml = run_config_to_toml(c);
    EXPECT_TRUE(toml.find(std::string("communicator = \"") + kind + "\"") != std::string::npos ||
                toml.find(std::string("communicator = '") + kind + "'") != std::string::npos)
        << toml;
    EXPECT_EQ(parse_run_config(toml, "saved.toml").parallel.communicator, c.parallel.communicator);
  }
}

TEST(CommunicatorChoice, HostRunsOnMpi) {
  const Registered nccl(&kNccl);
  for (const char* kind : {"auto", "mpi"}) {
    const CommunicatorChoice choice =
        choose(config({std::string("parallel.communicator=") + kind}), 4);
    EXPECT_EQ(choice.device, nullptr);
    EXPECT_EQ(choice.description, "mpi");
  }
  const std::string e = error_of([] { choose(config({"parallel.communicator=nccl"}), 4); });
  EXPECT_NE(e.find("[parallel] parallel.communicator=\"nccl\" needs train.device=\"cuda\""),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(CommunicatorChoice, AutoTakesNcclOnADeviceWithMoreThanOneRank) {
  const Registered nccl(&kNccl);
  const CommunicatorChoice two = choose(config({"train.device=cuda"}), 2);
  EXPECT_EQ(two.device, &kNccl);
  EXPECT_EQ(two.description, "nccl");
  // One rank moves nothing: MPI's group of one.
  const CommunicatorChoice one = choose(config({"train.device=cuda"}), 1);
  EXPECT_EQ(one.device, nullptr);
  EXPECT_EQ(one.description, "mpi (auto: one rank)");
  // Pipeline stages keep the job on MPI; asked for, NCCL with them is one line.
  const CommunicatorChoice pipeline = choose(config({"train.device=cuda", "parallel.pp=2"}), 4);
  EXPECT_EQ(pipeline.device, nullptr);
  EXPECT_NE(pipeline.description.find("mpi (auto: pipeline stages pass activations over MPI"),
            std::string::npos)
      << pipeline.description;
  const std::string e = error_of([] {
    choose(config({"train.device=cuda", "parallel.pp=2", "parallel.communicator=nccl"}), 4);
  });
  EXPECT_NE(e.find("[parallel] parallel.communicator=\"nccl\" with parallel.pp=2: pipeline "
                   "stages"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // Asked for, NCCL serves one rank too; "mpi" stays MPI.
  EXPECT_EQ(choose(config({"train.device=cuda", "parallel.communicator=nccl"}), 1).device, &kNccl);
  const CommunicatorChoice mpi =
      choose(config({"train.device=cuda", "parallel.communicator=mpi"}), 8);
  EXPECT_EQ(mpi.device, nullptr);
  EXPECT_EQ(mpi.description, "mpi");
}

TEST(CommunicatorChoice, NcclIsRefusedWhereTheProgramHasNone) {
  for (const dist::DeviceCommunicatorFactory* factory :
       {static_cast<const dist::DeviceCommunicatorFactory*>(nullptr), &kOther}) {
    const Registered registered(factory);
    const CommunicatorChoice choice = choose(config({"train.device=cuda"}), 2);
    EXPECT_EQ(choice.device, nullptr);
    EXPECT_EQ(choice.description,
              "mpi (auto: this program has no NCCL communicator for cuda memory)");
    const std::string e = error_of([] {
      choose(config({"train.device=cuda", "parallel.communicator=nccl"}), 2);
    });
    EXPECT_NE(e.find("[parallel] parallel.communicator=\"nccl\": this moecore program has no NCCL "
                     "communicator for cuda memory"),
              std::string::npos)
        << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// The factory is asked (collectively, over MPI's world) only where NCCL is in question, and what
// it says keeps auto on MPI and refuses "nccl" in one line.
TEST(CommunicatorChoice, NcclIsRefusedWhereItCannotServeTheRanks) {
  const Registered nccl(&kNccl);
  const std::string shared = "ranks 0 and 1 share one GPU, and NCCL takes one rank per device";
  g_asked = 0;
  choose(config({}), 2, shared);
  choose(config({"train.device=cuda", "parallel.communicator=mpi"}), 2, shared);
  choose(config({"train.device=cuda"}), 1, shared);
  EXPECT_EQ(g_asked, 0);
  const CommunicatorChoice choice = choose(config({"train.device=cuda"}), 2, shared);
  EXPECT_EQ(g_asked, 1);
  EXPECT_EQ(choice.device, nullptr);
  EXPECT_EQ(choice.description, "mpi (auto: " + shared + ")");
  const std::string e = error_of([&shared] {
    choose(config({"train.device=cuda", "parallel.communicator=nccl"}), 2, shared);
  });
  EXPECT_NE(e.find("[parallel] parallel.communicator=\"nccl\": " + shared), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(CommunicatorChoice, OnlyDevicesTakeARegistration) {
  EXPECT_EQ(dist::device_communicator(Device::kCpu), nullptr);
  const std::string e = error_of([] { dist::register_device_communicator(Device::kCpu, &kNccl); });
  EXPECT_NE(e.find("host memory is MPI's"), std::string::npos) << e;
}

// The pp group split from another world with the same ranks (the trainer's MPI world beside
// NCCL's); a world of one here.
TEST(CommunicatorChoice, MeshSplitsPpFromTheGivenWorld) {
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  const std::unique_ptr<dist::Communicator> other = dist::mpi_world();
  const dist::Mesh mesh = dist::Mesh::build(*world, 1, 1, other.get());
  EXPECT_EQ(&mesh.world, world.get());
  EXPECT_EQ(mesh.pp.size(), 1);
  EXPECT_EQ(mesh.dp.size(), 1);
}

// parallel.rowwise_transport="symmetric": its kernel stores into other GPUs' memory, which only the
// device's communicator reaches; on MPI (chosen, or left there by auto) one line names why, and
// a CPU run is refused when the config is read. With ep = 1 nothing moves and nothing is refused.
TEST(CommunicatorChoice, SymmetricTransportNeedsTheDevicesCommunicator) {
  const Registered nccl(&kNccl);
  const std::vector<std::string> symmetric = {"train.device=cuda", "parallel.ep=2",
                                              "parallel.dispatch=rowwise",
                                              "parallel.rowwise_transport=symmetric"};
  EXPECT_EQ(choose(config(symmetric), 2).device, &kNccl);

  std::vector<std::string> on_mpi = symmetric;
  on_mpi.push_back("parallel.communicator=mpi");
  std::string e = error_of([&] { choose(config(on_mpi), 2); });
  EXPECT_NE(e.find("parallel.rowwise_transport=\"symmetric\" needs the NCCL communicator, and "
                   "this job's is mpi: use \"padded\""),
            std::string::npos)
      << e;
  e = error_of([&] { choose(config(symmetric), 2, "two ranks share GPU 0"); });
  EXPECT_NE(e.find("this job's is mpi (auto: two ranks share GPU 0)"), std::string::npos) << e;

  std::vector<std::string> one_expert_group = on_mpi;
  one_expert_group[1] = "parallel.ep=1";
  EXPECT_EQ(choose(config(one_expert_group), 2).device, nullptr);

  std::vector<std::string> on_the_cpu = symmetric;
  on_the_cpu[0] = "train.device=cpu";
  e = error_of([&] { config(on_the_cpu); });
  EXPECT_NE(e.find("parallel.rowwise_transport=\"symmetric\" needs train.device=\"cuda\""),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace moecore
