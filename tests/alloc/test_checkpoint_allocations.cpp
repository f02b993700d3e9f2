// A checkpoint save holds no second copy of what it saves: the weights and the Adam moments are
// written to their files from where they live (io::SafetensorsWriter borrows host tensors), so a
// run that fits in memory while it trains still fits while it saves. Counted here as heap
// allocations above 64 KiB made by the program during the trainer's own save sequence
// (train/callbacks/checkpointer.cpp: begin_checkpoint, this rank's part from the distributed
// optimizer's checkpoint_weights and checkpoint_state, commit_checkpoint) of a model whose every
// large tensor (embedding, LM head, the experts' weights and moments) exceeds that: a copy of any
// of them fails the test, with its size and backtrace.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "dist/distributed_optimizer.h"
#include "dist/mesh.h"
#include "dist/mpi/mpi_runtime.h"
#include "heap_counter.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "train/checkpoint.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kCheckpointLargeBytes = 64 * 1024;

// Embedding and LM head 512 x 64 fp32 (128 KiB each), each expert projection 16 x 64 x 128
// (512 KiB): every one above the bound, as is each of its two moments.
ModelConfig checkpoint_model() {
  ModelConfig m;
  m.vocab_size = 512;
  m.hidden_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_experts = 16;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 64;
  m.tie_word_embeddings = false;
  return m;
}

TEST(CheckpointAllocations, SaveCopiesNoTensor) {
  if (!test::heap_counting_available())
    GTEST_SKIP() << "the sanitizers own malloc here: heap allocations are counted in the release "
                    "build only";
  RunConfig config;
  config.model = checkpoint_model();
  const ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  init_params(layout, 5, params);
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  ASSERT_EQ(world->size(), 1);
  const dist::Mesh mesh = dist::Mesh::build(*world, 1);
  const dist::DistributedOptimizer optimizer(layout, OptimConfig{}, mesh, /*zero1=*/false);
  std::string run_dir = (fs::path(::testing::TempDir()) / "moecore_ckpt_alloc_XXXXXX").string();
  ASSERT_NE(::mkdtemp(run_dir.data()), nullptr);
  const CheckpointContents contents{
      &config, &layout, nullptr, nullptr, {{"step", 3}}, io::hf_config_json(config.model, 64, 3),
      "",      {}};

  test::start_counting_large_allocations(kCheckpointLargeBytes);
  const std::string staging = begin_checkpoint(run_dir, 3, ::getpid());
  write_checkpoint_part(staging, {0,
                                  1,
                                  &params,
                                  optimizer.checkpoint_weights(),
                                  optimizer.checkpoint_state(),
                                  int64_t{3},
                                  {}});
  const std::string saved = commit_checkpoint(run_dir, 3, staging, contents, 1, 0);
  const test::LargeAllocations counted = test::stop_counting_large_allocations();

  // The save is complete (the tensors were written, not skipped).
  EXPECT_GT(fs::file_size(fs::path(saved) / "model.safetensors"), 2 * 512 * 64 * sizeof(float));
  EXPECT_GT(fs::file_size(fs::path(saved) / "optim.safetensors"),
            2 * fs::file_size(fs::path(saved) / "model.safetensors") - 64 * 1024);
  fs::remove_all(run_dir);
  EXPECT_EQ(counted.count, 0) << "heap allocations above " << kCheckpointLargeBytes
                              << " bytes while saving a checkpoint (the first few, with their "
                                 "callers):\n"
                              << counted.report;
}

}  // namespace
}  // namespace moecore
