// NCCL's communicator as the training job's (issue 15 item 4): registered as the moecore command
// registers it once it has selected the GPU (dist/nccl/nccl_registration.h), looked up by the
// trainer through dist/device_communicators.h. On one GPU the job has one rank, so its
// collectives complete without reaching NCCL (groups of one); what runs on NCCL is the
// communicator's creation over the bootstrap (ncclCommInitRank), the mesh's ncclCommSplits, the
// barriers of the checkpoint and their destruction. The job on NCCL must train as the same job on
// MPI's group of one does: one rank moves nothing, so the losses agree bit for bit. In two
// processes (the *ranks2* cases below) the job moves its data over NCCL.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/splitmix64.h"
#include "dist/device_communicators.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "dist/nccl/nccl_registration.h"
#include "kernels/cuda/device_selection.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace moecore::cuda_test {
namespace {

namespace fs = std::filesystem;

// Selects the GPU and registers NCCL's communicator, as select_device does for `moecore train
// --device cuda`; restores the previous registration at the end.
class NcclRegistered : public ::testing::Test {
 protected:
  void SetUp() override {
    (void)kernels::cuda::activate();
    previous_ = dist::device_communicator(Device::kCuda);
    dist::nccl::register_communicator();
  }
  void TearDown() override { dist::register_device_communicator(Device::kCuda, previous_); }

 private:
  const dist::DeviceCommunicatorFactory* previous_ = nullptr;
};

TEST_F(NcclRegistered, FactoryMakesTheWorldAndTheMeshOverNccl) {
  const dist::DeviceCommunicatorFactory* factory = dist::device_communicator(Device::kCuda);
  ASSERT_NE(factory, nullptr);
  EXPECT_STREQ(factory->name, "nccl");
  EXPECT_EQ(dist::device_communicator(Device::kCpu), nullptr);

  const std::unique_ptr<dist::Communicator> mpi = dist::mpi_world();
  const std::unique_ptr<dist::Communicator> world = factory->create(*mpi, "world");
  EXPECT_TRUE(world->reaches_device_memory());
  EXPECT_EQ(world->rank(), mpi->rank());
  EXPECT_EQ(world->size(), mpi->size());
  EXPECT_EQ(world->name(), "world");
  world->barrier();  // a one-element ncclAllReduce, then the stream's synchronisation

  // The trainer's mesh: dp, ep and ep_dp split from NCCL's world, pp from MPI's.
  const dist::Mesh mesh = dist::Mesh::build(*world, 1, 1, mpi.get());
  EXPECT_TRUE(mesh.dp.reaches_device_memory());
  EXPECT_TRUE(mesh.ep.reaches_device_memory());
  EXPECT_TRUE(mesh.ep_dp.reaches_device_memory());
  EXPECT_FALSE(mesh.pp.reaches_device_memory());
  EXPECT_EQ(mesh.dp.size(), world->size());
  mesh.dp.barrier();
  mesh.ep_dp.barrier();
}

class NcclTrainingJob : public NcclRegistered {
 protected:
  // One directory for every rank of the job (rank 0's process id names it), its tokens written
  // by rank 0.
  void SetUp() override {
    NcclRegistered::SetUp();
    world_ = dist::mpi_world();
    int64_t id = ::getpid();
    world_->broadcast(&id, sizeof id, 0);
    dir_ = fs::temp_directory_path() / fmt::format("moecore_nccl_job_{}", id);
    if (world_->rank() == 0) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      SplitMix64 rng(11);
      std::vector<uint16_t> tokens(32 * 64);
      for (uint16_t& token : tokens) token = static_cast<uint16_t>(rng.bounded(300));
      std::ofstream file(dir_ / "train.npy", std::ios::binary);
      file.write(reinterpret_cast<const char*>(tokens.data()),
                 static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    }
    world_->barrier();
  }
  void TearDown() override {
    world_->barrier();
    if (world_->rank() == 0) fs::remove_all(dir_);
    NcclRegistered::TearDown();
  }

  // A small MoE run of 3 steps on the GPU, with its final checkpoint (the checkpointer's
  // barriers run on the world).
  RunConfig config(const std::string& communicator, const std::string& out,
                   const std::string& parallel = "", const std::string& train = "") const {
    return parse_run_config(fmt::format(R"([model]
vocab_size = 300
hidden_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
num_experts = 8
num_experts_per_tok = 2
moe_intermediate_size = 32
intermediate_size = 96
first_k_dense_replace = 1

[train]
seed = 3
max_steps = 3
batch_size = 4
microbatches = 2
seq_len = 64
log_every = 1
eval_every = 0
device = "cuda"
out_dir = "{}"
{}

[data]
train = ["{}"]
dtype = "uint16"

[parallel]
communicator = "{}"
{}
)",
                                        (dir_ / out).string(), train, (dir_ / "train.npy").string(),
                                        communicator, parallel),
                            "nccl_training_job");
  }

  std::unique_ptr<dist::Communicator> world_;
  fs::path dir_;
};

// train() with its standard output kept (and printed when it throws).
TrainSummary train_capturing(const RunConfig& config, std::string& output) {
  ::testing::internal::CaptureStdout();
  try {
    const TrainSummary summary = train(config, {});
    output += ::testing::internal::GetCapturedStdout();
    return summary;
  } catch (...) {
    std::fputs(::testing::internal::GetCapturedStdout().c_str(), stdout);
    throw;
  }
}

TEST_F(NcclTrainingJob, OneRankTrainsOnNcclAsOnMpi) {
  if (world_->size() != 1) GTEST_SKIP() << "runs in one process";
  std::string output;
  const TrainSummary nccl = train_capturing(config("nccl", "nccl"), output);
  const TrainSummary mpi = train_capturing(config("mpi", "mpi"), output);
  EXPECT_NE(output.find("parallel: 1 rank; communicator nccl\n"), std::string::npos) << output;
  EXPECT_EQ(nccl.steps, 3);
  EXPECT_TRUE(std::isfinite(nccl.last_loss));
  EXPECT_TRUE(fs::is_directory(dir_ / "nccl" / "checkpoints" / "step_00000003"));
  // One rank moves nothing: the runs differ only if the backend is not deterministic.
  EXPECT_EQ(nccl.first_loss, mpi.first_loss);
  EXPECT_EQ(nccl.last_loss, mpi.last_loss);
}

// "auto" leaves a job of one rank on MPI's group of one (nothing to move), and names why.
TEST_F(NcclTrainingJob, AutoKeepsOneRankOnMpi) {
  if (world_->size() != 1) GTEST_SKIP() << "runs in one process";
  std::string output;
  const TrainSummary summary = train_capturing(config("auto", "auto"), output);
  EXPECT_EQ(summary.steps, 3);
  EXPECT_EQ(output.find("communicator nccl"), std::string::npos) << output;
}

// The job in two processes, one GPU each, on NCCL against the same job on MPI (ctest
// CudaSim.TwoRanks: cudasim's GPUs and NCCL; Cuda.TwoRanks on a machine with two GPUs). Over two
// ranks every reduction adds two terms, the same in either order, and the rest moves bits: the
// losses agree bit for bit, whichever communicator moved the gradients, the tokens and the
// statistics. The symmetric transport (the kernel's stores into the peer's window) runs against
// MPI's padded transport, which moves the same blocks. A captured run (train.cuda_graph: every
// step one graph, the collectives and the exchange's kernel inside it) runs against the same job
// on NCCL eagerly. Only rank 0 prints, so the start-up lines are checked there.
struct TwoRankJob {
  std::string name;
  std::string parallel;      // the NCCL job's [parallel] keys
  std::string against;       // the job it must equal: "mpi" (with mpi_parallel) or "eager"
  std::string mpi_parallel;  // the MPI job's [parallel] keys
  std::string train{};       // more [train] keys of both jobs
  bool graph = false;        // the NCCL job captures its steps (train.cuda_graph)
};

void PrintTo(const TwoRankJob& job, std::ostream* out) {
  *out << job.name;
}

class NcclTwoRankJob : public NcclTrainingJob, public ::testing::WithParamInterface<TwoRankJob> {};

TEST_P(NcclTwoRankJob, ranks2_trains_as_its_oracle) {
  const TwoRankJob& job = GetParam();
  if (world_->size() != 2) GTEST_SKIP() << "runs in 2 processes (mpirun -n 2)";
  if (const std::string why = dist::device_communicator(Device::kCuda)->unusable(*world_);
      !why.empty())
    GTEST_SKIP() << why;
  std::string output;
  const TrainSummary nccl = train_capturing(
      config("nccl", "nccl", job.parallel, job.train + (job.graph ? "\ncuda_graph = true" : "")),
      output);
  const TrainSummary oracle =
      job.against == "mpi"
          ? train_capturing(config("mpi", "mpi", job.mpi_parallel, job.train), output)
          : train_capturing(config("nccl", "eager", job.parallel, job.train), output);
  if (world_->rank() == 0) {  // the rank that prints
    EXPECT_NE(output.find("parallel: 2 ranks"), std::string::npos) << output;
    EXPECT_NE(output.find("communicator nccl"), std::string::npos) << output;
    if (job.graph) {
      EXPECT_NE(output.find("cuda_graph: 1 steps replayed"), std::string::npos) << output;
    }
  }
  EXPECT_EQ(nccl.steps, 3);
  EXPECT_TRUE(std::isfinite(nccl.last_loss));
  EXPECT_EQ(nccl.first_loss, oracle.first_loss) << output;
  EXPECT_EQ(nccl.last_loss, oracle.last_loss) << output;
  EXPECT_TRUE(fs::is_directory(dir_ / "nccl" / "checkpoints" / "step_00000003"));
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, NcclTwoRankJob,
    ::testing::Values(
        // Experts over the two ranks by the synchronous dispatch's all-to-all-v, the dense
        // parameters' data parallelism with ZeRO-1 (reduce-scatter of the gradients, all-gather
        // of the weights).
        TwoRankJob{"ep_sync_zero", "ep = 2\nzero = 1", "mpi", "ep = 2\nzero = 1"},
        // The rowwise dispatch's padded transport, routes dropped, the dense gradients reduced
        // while the backward runs (non-blocking all-reduces).
        TwoRankJob{"ep_padded_overlap_drops",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"padded\"\n"
                   "capacity_factor = 0.75\noverlap_grad_reduce = true",
                   "mpi",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"padded\"\n"
                   "capacity_factor = 0.75\noverlap_grad_reduce = true"},
        // The symmetric transport: the kernel stores each block into the peer's window.
        TwoRankJob{"ep_symmetric_drops",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"symmetric\"\n"
                   "capacity_factor = 0.75",
                   "mpi",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"padded\"\n"
                   "capacity_factor = 0.75"},
        // MXFP8 experts captured (OLMo-core's recipe, its expert weight gradients in bf16; on
        // Hopper's path, dequantised to bf16) over the symmetric transport.
        TwoRankJob{"ep_symmetric_mxfp8_cuda_graph",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"symmetric\"", "eager", "",
                   "precision = \"mxfp8\"", true},
        // Every step one graph (bf16: fp32 experts read their offsets on the host), replayed
        // from the third step: ZeRO-1's collectives captured with the kernels.
        TwoRankJob{"dp_zero_bf16_cuda_graph", "zero = 1", "eager", "", "precision = \"bf16\"",
                   true},
        // The symmetric exchange's kernel and the overlapped all-reduces captured with the step.
        TwoRankJob{"ep_symmetric_overlap_bf16_cuda_graph",
                   "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"symmetric\"\n"
                   "capacity_factor = 0.75\noverlap_grad_reduce = true",
                   "eager", "", "precision = \"bf16\"", true}),
    [](const ::testing::TestParamInfo<TwoRankJob>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace moecore::cuda_test
