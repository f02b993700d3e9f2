// Checkpoints: save / list / latest_valid / load round trip on a tiny model, keep_last pruning,
// re-saving a step, clean-up of interrupted saves, fallback past damaged checkpoints (their
// structure, and values changed inside them, which only the checksums see), the architecture
// check on load, and a save that fails on a full disk.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/crc32c.h"
#include "io/file_util.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "scratch_dir.h"
#include "train/checkpoint.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_model() {
  ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 6;
  c.intermediate_size = 10;
  c.first_k_dense_replace = 1;
  return c;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Every regular file under dir, relative path -> contents.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      files[fs::relative(entry.path(), dir).string()] = read_bytes(entry.path());
  return files;
}

std::vector<std::string> names(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) out.push_back(fs::path(p).filename().string());
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest()
      : layout_(ParamLayout::build(tiny_model())),
        params_(layout_),
        optimizer_(layout_, OptimConfig{}) {}

  void SetUp() override {
    config_.model = tiny_model();
    config_.train.seed = 7;
    init_params(layout_, 1234, params_);
    // Distinct, recognisable moments.
    for (size_t i = 0; i < optimizer_.exp_avg().dense.size(); ++i) {
      optimizer_.exp_avg().dense.span()[i] = 0.001f * static_cast<float>(i);
      optimizer_.exp_avg_sq().dense.span()[i] = 0.5f + 0.002f * static_cast<float>(i);
    }
    for (size_t i = 0; i < optimizer_.exp_avg().expert.size(); ++i) {
      optimizer_.exp_avg().expert.span()[i] = -0.003f * static_cast<float>(i);
      optimizer_.exp_avg_sq().expert.span()[i] = 0.25f + 0.001f * static_cast<float>(i);
    }
    optimizer_.set_steps_taken(42);
  }

  void TearDown() override { io::set_write_failure_for_testing(-1); }

  // A trainer state that agrees with config_ (the loader checks every field against it).
  nlohmann::json trainer_state(int64_t step) const {
    const TrainConfig& t = config_.train;
    return {{"step", step},
            {"tokens_seen", step * t.batch_size * t.seq_len},
            {"data_cursor", step * t.batch_size},
            {"seed", t.seed},
            {"step_guard", {{"losses", {2.5, 2.4}}, {"grad_norms", {1.0, 0.9}}, {"skipped", 0}}},
            {"gerrymandering",
             {{"lb", nlohmann::json::array()},
              {"imbalance", nlohmann::json::array()},
              {"flagged", false}}}};
  }

  CheckpointContents contents(int64_t step, const std::string& tokenizer = "") {
    CheckpointContents c{&config_,
                         &layout_,
                         &params_,
                         &optimizer_,
                         trainer_state(step),
                         io::hf_config_json(config_.model, 64, 3),
                         tokenizer,
                         {}};
    return c;
  }

  std::string save(int64_t step, int64_t keep_last = 0) {
    return save_checkpoint(run_dir_.string(), step, contents(step), keep_last);
  }

  fs::path checkpoints() const { return run_dir_ / "checkpoints"; }

  std::optional<std::string> newest_valid(std::vector<DamagedCheckpoint>* damaged = nullptr) const {
    return latest_valid_checkpoint(run_dir_.string(), config_.model, layout_, damaged);
  }

  RunConfig config_;
  ParamLayout layout_;
  ParamBuffers params_;
  AdamW optimizer_;
  ScratchDir scratch_{"moecore_ckpt"};
  const fs::path run_dir_ = scratch_.path();
};

TEST_F(CheckpointTest, SaveListLoadRoundTrip) {
  const std::string dir = save(5);
  EXPECT_EQ(fs::path(dir).filename().string(), "step_00000005");
  for (const char* file : {"model.safetensors", "optim.safetensors", "config.json", "config.toml",
                           "trainer_state.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(dir) / file)) << file;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "tokenizer.json"));  // empty tokenizer: not written

  const std::vector<std::string> listed = list_checkpoints(run_dir_.string());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(fs::path(listed[0]), fs::path(dir));
  const auto latest = newest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest), fs::path(dir));

  // config.json is the HF config that was passed in.
  EXPECT_EQ(nlohmann::json::parse(read_bytes(fs::path(dir) / "config.json")),
            io::hf_config_json(config_.model, 64, 3));

  ParamBuffers loaded(layout_);
  AdamW loaded_optimizer(layout_, OptimConfig{});
  const nlohmann::json state =
      load_checkpoint(dir, config_.model, layout_, loaded, &loaded_optimizer);
  nlohmann::json expected_state = contents(5).trainer_state;
  expected_state["checksums"] = "checksums.json";  // the commit's promise of its manifest
  EXPECT_EQ(state, expected_state);
  EXPECT_EQ(host_copy(loaded.dense), host_copy(params_.dense));
  EXPECT_EQ(host_copy(loaded.expert), host_copy(params_.expert));
  EXPECT_EQ(host_copy(loaded_optimizer.exp_avg().dense), host_copy(optimizer_.exp_avg().dense));
  EXPECT_EQ(host_copy(loaded_optimizer.exp_avg().expert), host_copy(optimizer_.exp_avg().expert));
  EXPECT_EQ(host_copy(loaded_optimizer.exp_avg_sq().dense),
            host_copy(optimizer_.exp_avg_sq().dense));
  EXPECT_EQ(host_copy(loaded_optimizer.exp_avg_sq().expert),
            host_copy(optimizer_.exp_avg_sq().expert));
  EXPECT_EQ(loaded_optimizer.steps_taken(), 42);

  // Weights only: the optimizer argument may be null.
  ParamBuffers weights_only(layout_);
  load_checkpoint(dir, config_.model, layout_, weights_only, nullptr);
  EXPECT_EQ(host_copy(weights_only.dense), host_copy(params_.dense));
}

TEST_F(CheckpointTest, TokenizerJsonWrittenWhenNotEmpty) {
  const std::string tokenizer = R"({"model": {"type": "BPE"}})";
  const std::string dir = save_checkpoint(run_dir_.string(), 3, contents(3, tokenizer), 0);
  EXPECT_EQ(read_bytes(fs::path(dir) / "tokenizer.json"), tokenizer);
}

TEST_F(CheckpointTest, KeepLastKeepsNewest) {
  // Steps 3 and 10 sort by number, not by text, thanks to the zero padding.
  for (int64_t step : {3, 2, 10}) save(step, 2);
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000003", "step_00000010"}));
  save(11, 1);
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000011"}));
  save(12, 0);  // 0: keep all
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000011", "step_00000012"}));
}

// A process killed after committing a checkpoint but before pruning leaves one too many; the
// resumed run prunes relative to the checkpoint it resumes from, never touching newer ones.
TEST_F(CheckpointTest, PruneRelativeToResumedCheckpoint) {
  for (int64_t step : {2, 4, 6, 8}) save(step, 0);
  prune_checkpoints(run_dir_.string(), (run_dir_ / "checkpoints/step_00000006").string(), 2);
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000004", "step_00000006", "step_00000008"}));
  prune_checkpoints(run_dir_.string(), (run_dir_ / "checkpoints/step_00000008").string(), 0);
  EXPECT_EQ(list_checkpoints(run_dir_.string()).size(), 3u);  // keep_last 0: keep all
  prune_checkpoints(run_dir_.string(), (run_dir_ / "checkpoints/step_00000008").string(), 1);
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000008"}));
}

TEST_F(CheckpointTest, SavingSameStepTwiceReplacesIt) {
  save(4);
  params_.dense.span()[0] = 123.0f;
  optimizer_.set_steps_taken(99);
  const std::string dir = save(4);
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000004"}));
  // Nothing but the one checkpoint directory is left in checkpoints/.
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(checkpoints()))
    entries.push_back(entry.path().filename().string());
  EXPECT_EQ(entries, (std::vector<std::string>{"step_00000004"}));

  ParamBuffers loaded(layout_);
  AdamW loaded_optimizer(layout_, OptimConfig{});
  load_checkpoint(dir, config_.model, layout_, loaded, &loaded_optimizer);
  EXPECT_EQ(loaded.dense.span()[0], 123.0f);
  EXPECT_EQ(loaded_optimizer.steps_taken(), 99);
}

TEST_F(CheckpointTest, RemoveInterruptedSavesKeepsCompleteOnes) {
  save(1);
  fs::create_directories(checkpoints() / ".tmp-step_00000002-12345");
  write_bytes(checkpoints() / ".tmp-step_00000002-12345" / "model.safetensors", "partial");
  fs::create_directories(checkpoints() / ".tmp-step_00000001-777.replaced");
  // Interrupted saves are never listed.
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000001"}));

  remove_interrupted_saves(run_dir_.string());
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(checkpoints()))
    entries.push_back(entry.path().filename().string());
  EXPECT_EQ(entries, (std::vector<std::string>{"step_00000001"}));
  EXPECT_TRUE(newest_valid().has_value());

  // No checkpoints directory at all: nothing to do, nothing thrown.
  remove_interrupted_saves((run_dir_ / "absent").string());
}

TEST_F(CheckpointTest, LatestValidSkipsCorruptedHeader) {
  const std::string good = save(1);
  const std::string bad = save(2);
  std::string bytes = read_bytes(fs::path(bad) / "model.safetensors");
  ASSERT_GT(bytes.size(), 16u);
  for (size_t i = 8; i < 16; ++i) bytes[i] = '#';  // the JSON header no longer parses
  write_bytes(fs::path(bad) / "model.safetensors", bytes);
  const auto latest = newest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest), fs::path(good));
}

TEST_F(CheckpointTest, LatestValidSkipsMissingTrainerState) {
  const std::string good = save(1);
  const std::string bad = save(2);
  fs::remove(fs::path(bad) / "trainer_state.json");
  const auto latest = newest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest), fs::path(good));

  // With the older one damaged as well, there is no valid checkpoint.
  write_bytes(fs::path(good) / "trainer_state.json", "{not json");
  EXPECT_FALSE(newest_valid().has_value());
  EXPECT_FALSE(
      latest_valid_checkpoint((run_dir_ / "absent").string(), config_.model, layout_).has_value());
}

TEST_F(CheckpointTest, LoadWithAnotherArchitectureNamesTheKey) {
  const std::string dir = save(1);
  ModelConfig other = config_.model;
  other.moe_intermediate_size = 12;
  const ParamLayout other_layout = ParamLayout::build(other);
  ParamBuffers other_params(other_layout);
  try {
    load_checkpoint(dir, other, other_layout, other_params, nullptr);
    FAIL() << "load_checkpoint accepted another architecture";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("another architecture"), std::string::npos) << message;
    EXPECT_NE(message.find("moe_intermediate_size"), std::string::npos) << message;
  }
}

TEST_F(CheckpointTest, FailedSaveLeavesPreviousCheckpointIntact) {
  const std::string previous = save(1);
  const std::map<std::string, std::string> before = snapshot(checkpoints());

  // Fail after a few KiB: inside model.safetensors of the new save.
  io::set_write_failure_for_testing(2000);
  params_.dense.span()[0] = 7.0f;
  EXPECT_THROW(save(2, 1), Error);
  io::set_write_failure_for_testing(-1);

  EXPECT_EQ(snapshot(checkpoints()), before);  // no temp dir, previous one byte-identical
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000001"}));

  // Fail in trainer_state.json, and in the last file written (checksums.json), each after every
  // file before it is complete (the same sizes as step 1's but for the trainer state's digits).
  for (const char* last : {"trainer_state.json", "checksums.json"}) {
    int64_t written_before = 0;
    for (const auto& [name, bytes] : before)
      if (name.find("trainer_state.json") == std::string::npos &&
          name.find("checksums.json") == std::string::npos)
        written_before += static_cast<int64_t>(bytes.size());
    if (std::string(last) == "checksums.json")
      written_before += static_cast<int64_t>(trainer_state(3).dump(2).size() + 1);
    io::set_write_failure_for_testing(written_before + 3);
    EXPECT_THROW(save(3, 1), Error) << last;
    io::set_write_failure_for_testing(-1);
    EXPECT_EQ(snapshot(checkpoints()), before) << last;
  }

  // Failing while re-saving the same step leaves the old copy in place too.
  io::set_write_failure_for_testing(0);
  EXPECT_THROW(save(1, 1), Error);
  io::set_write_failure_for_testing(-1);
  EXPECT_EQ(snapshot(checkpoints()), before);
  const auto latest = newest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest), fs::path(previous));
}

// Issue 13: entries of checkpoints/ that moecore did not write are left alone.
TEST_F(CheckpointTest, NonDirectoryEntriesAreLeftAlone) {
  save(1);
  fs::create_directories(checkpoints());
  write_bytes(checkpoints() / "step_00000002", "a user's file, named like a checkpoint");
  write_bytes(checkpoints() / ".tmp-step_00000009-1-staging", "not a staging directory");
  write_bytes(checkpoints() / ".replaced-step_00000007", "not a moved checkpoint");
  fs::create_directory_symlink(fs::path(save(3)), checkpoints() / "step_00000005");
  const std::map<std::string, std::string> files = {
      {"step_00000002", read_bytes(checkpoints() / "step_00000002")},
      {".tmp-step_00000009-1-staging", read_bytes(checkpoints() / ".tmp-step_00000009-1-staging")},
      {".replaced-step_00000007", read_bytes(checkpoints() / ".replaced-step_00000007")}};
  remove_interrupted_saves(run_dir_.string());
  // Only real directories count as checkpoints (and are pruned); the others stay as they were.
  EXPECT_EQ(names(list_checkpoints(run_dir_.string())),
            (std::vector<std::string>{"step_00000001", "step_00000003"}));
  save(4, 1);
  for (const auto& [name, bytes] : files)
    EXPECT_EQ(read_bytes(checkpoints() / name), bytes) << name;
  EXPECT_TRUE(fs::is_symlink(checkpoints() / "step_00000005"));
  // A save whose directory name is taken by a file refuses, naming it, and keeps the file.
  try {
    save(2);
    FAIL() << "save over a regular file succeeded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("step_00000002 exists and is not a checkpoint directory"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(read_bytes(checkpoints() / "step_00000002"), files.at("step_00000002"));
}

TEST_F(CheckpointTest, StagingDirectoriesAreNamedPerProcess) {
  EXPECT_NE(checkpoint_staging_dir("run", 3, 100), checkpoint_staging_dir("run", 3, 101));
  EXPECT_NE(checkpoint_staging_dir("run", 3, 100).find(".tmp-step_00000003-100-"),
            std::string::npos);
}

TEST_F(CheckpointTest, TamperedTrainerStateMakesTheCheckpointDamaged) {
  const std::string good = save(1);
  const std::string bad = save(2);
  nlohmann::json state = trainer_state(2);
  state["step"] = -5;
  write_bytes(fs::path(bad) / "trainer_state.json", state.dump());
  std::vector<DamagedCheckpoint> damaged;
  const auto latest = newest_valid(&damaged);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest), fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].reason.find("step=-5 is out of range"), std::string::npos)
      << damaged[0].reason;
  ParamBuffers loaded(layout_);
  EXPECT_THROW(load_checkpoint(bad, config_.model, layout_, loaded, nullptr), Error);
}

TEST_F(CheckpointTest, LossCoefficientsAreNotAnotherArchitecture) {
  const std::string dir = save(1);
  ModelConfig other = config_.model;
  other.router_aux_loss_coef = 0.5;
  other.router_z_loss_coef = 0.25;
  ParamBuffers loaded(layout_);
  EXPECT_NO_THROW(load_checkpoint(dir, other, layout_, loaded, nullptr));
}

// A resume reads only what a rank holds. Parts written as ZeRO-1 shards cut tensors at arbitrary
// element offsets; any range of any tensor's moments reads back from them exactly, and a rank's
// expert layout gets exactly its experts' weights.
TEST_F(CheckpointTest, ReaderReadsRangesAcrossSlicesAndOneRanksExperts) {
  const int64_t step = 3;
  const std::string staging = begin_checkpoint(run_dir_.string(), step, 1);
  // Two parts: each group's flat buffer cut at 40% (inside tensors), as two ZeRO-1 ranks would.
  for (int64_t part = 0; part < 2; ++part) {
    CheckpointPart p{part, 2, &params_, {}, {}, optimizer_.steps_taken(), {}};
    for (const ParamSpec& spec : layout_.specs()) {
      const size_t cut = layout_.numel(spec.group) * 2 / 5;
      const size_t begin = std::max(spec.offset, part == 0 ? size_t{0} : cut);
      const size_t end = std::min(spec.offset + spec.numel, part == 0 ? cut : SIZE_MAX);
      if ((part == 0) == (spec.offset < cut)) p.weights.push_back(&spec);
      if (begin < end)
        p.state.push_back({&spec, begin - spec.offset, end - begin,
                           optimizer_.exp_avg().at(spec) + (begin - spec.offset),
                           optimizer_.exp_avg_sq().at(spec) + (begin - spec.offset)});
    }
    write_checkpoint_part(staging, p);
  }
  const std::string dir = commit_checkpoint(run_dir_.string(), step, staging, contents(step), 2, 0);
  // Each part's files are in checksums.json (their writers' CRCs, folded in by the commit, which
  // removed the side files), and the manifest holds.
  const nlohmann::json sums = nlohmann::json::parse(read_bytes(fs::path(dir) / "checksums.json"));
  for (const char* part :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "optim-00001-of-00002.safetensors", "optim-00002-of-00002.safetensors"}) {
    const std::string bytes = read_bytes(fs::path(dir) / part);
    EXPECT_EQ(sums["files"][part]["crc32c"],
              fmt::format("{:08x}", io::crc32c(std::as_bytes(std::span(bytes)))))
        << part;
  }
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_NE(entry.path().filename().string().rfind(".checksums-", 0), 0u) << entry.path();
  EXPECT_EQ(fs::path(newest_valid().value_or("")), fs::path(dir));
  const CheckpointReader reader = CheckpointReader::open(dir, config_.model, layout_, true);
  EXPECT_EQ(reader.steps_taken(), 42);
  size_t sliced = 0;
  for (const ParamSpec& spec : layout_.specs()) {
    const size_t cut = layout_.numel(spec.group) * 2 / 5;
    sliced += spec.offset < cut && cut < spec.offset + spec.numel;
    // Every range that starts or ends at 0, 1, the middle or the end of the tensor.
    for (size_t first : {size_t{0}, size_t{1}, spec.numel / 2}) {
      for (size_t last : {spec.numel / 2 + 1, spec.numel}) {
        if (first >= last || last > spec.numel) continue;
        std::vector<float> m(last - first), v(last - first);
        reader.read_moments(spec.name, first, last - first, m.data(), v.data());
        for (size_t i = 0; i < m.size(); ++i) {
          ASSERT_EQ(m[i], optimizer_.exp_avg().at(spec)[first + i]) << spec.name << " " << first;
          ASSERT_EQ(v[i], optimizer_.exp_avg_sq().at(spec)[first + i]) << spec.name;
        }
      }
    }
  }
  EXPECT_EQ(sliced, 2u);  // one tensor of each group is cut: the slices are exercised

  // Expert parallelism over 2 ranks: rank 1 holds experts 2 and 3 of the MoE layer.
  const ParamLayout rank1 = ParamLayout::build(config_.model, 2, 1);
  ParamBuffers mine(rank1);
  reader.read_weights(rank1, mine);
  for (const ParamSpec& spec : rank1.specs()) {
    const ParamSpec* whole = layout_.find(spec.name);
    ASSERT_NE(whole, nullptr) << spec.name;
    for (size_t i = 0; i < spec.numel; ++i)
      ASSERT_EQ(mine.at(spec)[i], params_.at(*whole)[i]) << spec.name;
  }
  EXPECT_NE(rank1.find("model.layers.1.mlp.experts.2.up_proj.weight"), nullptr);
  EXPECT_EQ(rank1.find("model.layers.1.mlp.experts.0.up_proj.weight"), nullptr);
  // A range outside the tensor is an error, not a read past it.
  const ParamSpec& first_spec = layout_.specs().front();
  std::vector<float> m(2), v(2);
  EXPECT_THROW(reader.read_moments(first_spec.name, first_spec.numel - 1, 2, m.data(), v.data()),
               Error);
}

TEST_F(CheckpointTest, OptimizerMetadataIsCheckedNotTrusted) {
  const std::string dir = save(1);
  const std::string optim = (fs::path(dir) / "optim.safetensors").string();
  const io::SafetensorsReader original = io::SafetensorsReader::open(optim);
  for (const char* steps : {"-3", "12x", "", "99999999999999999999"}) {
    io::SafetensorsWriter rewritten;
    for (const std::string& name : original.names())
      rewritten.add_f32(name, original.info(name).shape, original.read_f32(name));
    rewritten.set_metadata("steps_taken", steps);
    rewritten.write(optim + ".new");
    fs::rename(optim + ".new", optim);
    ParamBuffers loaded(layout_);
    AdamW loaded_optimizer(layout_, OptimConfig{});
    try {
      load_checkpoint(dir, config_.model, layout_, loaded, &loaded_optimizer);
      FAIL() << "steps_taken '" << steps << "' was accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("__metadata__.steps_taken='") + steps + "'"),
                std::string::npos)
          << message;
    }
  }
}

// Every other file of a checkpoint is in its checksums.json, with its size and CRC-32C.
TEST_F(CheckpointTest, ChecksumsListEveryOtherFile) {
  const std::string dir = save_checkpoint(run_dir_.string(), 3, contents(3, "{}"), 0);
  const nlohmann::json manifest =
      nlohmann::json::parse(read_bytes(fs::path(dir) / "checksums.json"));
  EXPECT_EQ(manifest["algorithm"], "crc32c");
  std::map<std::string, std::string> files = snapshot(dir);
  ASSERT_EQ(files.erase("checksums.json"), 1u);
  ASSERT_EQ(manifest["files"].size(), files.size());
  for (const auto& [name, bytes] : files) {
    ASSERT_TRUE(manifest["files"].contains(name)) << name;
    EXPECT_EQ(manifest["files"][name]["bytes"], bytes.size()) << name;
    EXPECT_EQ(manifest["files"][name]["crc32c"],
              fmt::format("{:08x}", io::crc32c(std::as_bytes(std::span(bytes)))))
        << name;
  }
}

// A value changed inside a file, its structure intact (a flipped bit on a failing disk, an edit):
// only the checksums see it. The checkpoint is skipped, naming the file; the older one resumes.
TEST_F(CheckpointTest, LatestValidSkipsAValueChangedInsideAFile) {
  const std::string good = save(1);
  const std::string bad = save(2);
  const auto flip_data_bit = [&](const char* file, size_t from_end) {
    const fs::path path = fs::path(bad) / file;
    std::string bytes = read_bytes(path);
    ASSERT_GT(bytes.size(), from_end);
    bytes[bytes.size() - from_end] ^= 0x01;
    write_bytes(path, bytes);
  };
  const std::string originals[] = {read_bytes(fs::path(bad) / "model.safetensors"),
                                   read_bytes(fs::path(bad) / "optim.safetensors"),
                                   read_bytes(fs::path(bad) / "trainer_state.json")};
  for (const char* file : {"model.safetensors", "optim.safetensors", "trainer_state.json"}) {
    if (std::string(file) == "trainer_state.json") {
      // In range, the same size (2.5 -> 2.6): only the checksum can tell.
      nlohmann::json state = nlohmann::json::parse(originals[2]);
      state["step_guard"]["losses"][0] = 2.6;
      write_bytes(fs::path(bad) / file, state.dump(2) + "\n");
    } else {
      flip_data_bit(file, 4);  // the last value's lowest byte (little-endian f32)
    }
    std::vector<DamagedCheckpoint> damaged;
    const auto found = newest_valid(&damaged);
    ASSERT_TRUE(found.has_value()) << file;
    EXPECT_EQ(fs::path(*found), fs::path(good)) << file;
    ASSERT_EQ(damaged.size(), 1u) << file;
    EXPECT_NE(damaged[0].reason.find(std::string(file) + ": its CRC-32C is"), std::string::npos)
        << damaged[0].reason;
    write_bytes(fs::path(bad) / "model.safetensors", originals[0]);
    write_bytes(fs::path(bad) / "optim.safetensors", originals[1]);
    write_bytes(fs::path(bad) / "trainer_state.json", originals[2]);
    ASSERT_EQ(fs::path(newest_valid().value_or("")), fs::path(bad))
        << file;  // restored: valid again
  }
  // A listed file that is gone, or whose size changed.
  fs::remove(fs::path(bad) / "config.json");
  std::vector<DamagedCheckpoint> damaged;
  EXPECT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].reason.find("config.json: missing (listed in checksums.json)"),
            std::string::npos)
      << damaged[0].reason;
  // A manifest that is not one.
  write_bytes(fs::path(bad) / "checksums.json", R"({"algorithm": "md5", "files": {}})");
  damaged.clear();
  EXPECT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].reason.find("not a checksum manifest"), std::string::npos)
      << damaged[0].reason;
}

// Processes that share the reading each read the files at their positions of the manifest: a
// value changed inside one file is seen by exactly one share, and the combined verdict (here:
// both shares' reasons, the first that failed) makes the checkpoint damaged for all.
TEST_F(CheckpointTest, SharedVerificationReadsEachFileOnceAndCombinesTheVerdicts) {
  const std::string good = save(1);
  const std::string bad = save(2);
  const fs::path model = fs::path(bad) / "model.safetensors";
  std::string bytes = read_bytes(model);
  bytes[bytes.size() - 4] ^= 0x01;
  write_bytes(model, bytes);
  // What each share alone says about the damaged checkpoint: exactly one of two sees it.
  std::vector<std::string> verdicts;
  for (int64_t index = 0; index < 2; ++index) {
    std::vector<DamagedCheckpoint> damaged;
    const VerificationShare alone{index, 2, [](const std::string& r) { return r; }};
    const auto found =
        latest_valid_checkpoint(run_dir_.string(), config_.model, layout_, &damaged, alone);
    verdicts.push_back(damaged.empty() ? std::string() : damaged[0].reason);
    EXPECT_EQ(fs::path(found.value_or("")), fs::path(damaged.empty() ? bad : good)) << index;
  }
  EXPECT_NE(verdicts[0].empty(), verdicts[1].empty()) << verdicts[0] << " | " << verdicts[1];
  const std::string seen = verdicts[0].empty() ? verdicts[1] : verdicts[0];
  EXPECT_NE(seen.find("model.safetensors: its CRC-32C is"), std::string::npos) << seen;
  // The share that saw nothing, combined with the other's verdict, falls back as well.
  const int64_t blind = verdicts[0].empty() ? 0 : 1;
  std::vector<DamagedCheckpoint> damaged;
  int calls = 0;  // the first candidate is the newest, the damaged one
  const VerificationShare combined{blind, 2, [&](const std::string& mine) {
                                     return ++calls == 1 && mine.empty() ? seen : mine;
                                   }};
  EXPECT_EQ(fs::path(latest_valid_checkpoint(run_dir_.string(), config_.model, layout_, &damaged,
                                             combined)
                         .value_or("")),
            fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_EQ(damaged[0].reason, seen);
}

// A checkpoint written before moecore wrote checksums (no manifest, no promise of one in its
// trainer state) resumes, checked without them; one whose trainer state promises the manifest
// (every checkpoint moecore writes now) is damaged without it.
TEST_F(CheckpointTest, ACheckpointWithoutChecksumsStillResumes) {
  const std::string old = save(1);
  fs::remove(fs::path(old) / "checksums.json");
  nlohmann::json state = nlohmann::json::parse(read_bytes(fs::path(old) / "trainer_state.json"));
  ASSERT_EQ(state["checksums"], "checksums.json");
  state.erase("checksums");
  write_bytes(fs::path(old) / "trainer_state.json", state.dump(2) + "\n");
  EXPECT_EQ(fs::path(newest_valid().value_or("")), fs::path(old));

  const std::string dir = save(2);
  EXPECT_EQ(fs::path(newest_valid().value_or("")), fs::path(dir));
  fs::remove(fs::path(dir) / "checksums.json");
  std::vector<DamagedCheckpoint> damaged;
  EXPECT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(old));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(
      damaged[0].reason.find("checksums.json: missing, but its trainer_state.json says it was"),
      std::string::npos)
      << damaged[0].reason;
}

// The choice makes the checks the resume makes (CheckpointReader::open): damage that only they
// see falls back to an older checkpoint too, and another architecture resumes none.
TEST_F(CheckpointTest, LatestValidMakesTheReadersChecks) {
  const std::string good = save(1);
  const std::string bad = save(2);
  const std::string optim = (fs::path(bad) / "optim.safetensors").string();
  const io::SafetensorsReader original = io::SafetensorsReader::open(optim);
  io::SafetensorsWriter rewritten;  // no steps_taken in the metadata
  for (const std::string& name : original.names())
    rewritten.add_f32(name, original.info(name).shape, original.read_f32(name));
  rewritten.write(optim + ".new");
  fs::rename(optim + ".new", optim);
  std::vector<DamagedCheckpoint> damaged;
  EXPECT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].reason.find("no steps_taken in the metadata"), std::string::npos)
      << damaged[0].reason;

  ModelConfig other = config_.model;
  other.moe_intermediate_size = 12;
  const ParamLayout other_layout = ParamLayout::build(other);
  damaged.clear();
  EXPECT_FALSE(latest_valid_checkpoint(run_dir_.string(), other, other_layout, &damaged));
  ASSERT_EQ(damaged.size(), 2u);
  EXPECT_NE(damaged[1].reason.find("another architecture"), std::string::npos) << damaged[1].reason;
  EXPECT_EQ(fs::path(damaged[1].dir), fs::path(good));
}

// A damaged checkpoint set aside keeps every byte under a name no listing takes for a checkpoint,
// so the resumed run's save of the same step replaces nothing; a second one of the same step (a
// later resume that found step 2 damaged again) gets its own name.
TEST_F(CheckpointTest, ADamagedCheckpointSetAsideKeepsItsBytesAndIsNoLongerListed) {
  const std::string good = save(1);
  const std::string bad = save(2);
  const fs::path model = fs::path(bad) / "model.safetensors";
  std::string bytes = io::read_text(model.string(), "test");
  bytes[bytes.size() / 2] ^= 0x10;
  io::write_text_atomic(model.string(), bytes, "test");
  std::vector<DamagedCheckpoint> damaged;
  ASSERT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(good));
  ASSERT_EQ(damaged.size(), 1u);

  const std::string kept = set_aside_damaged_checkpoint(damaged[0].dir);
  EXPECT_EQ(fs::path(kept), checkpoints() / "damaged-step_00000002");
  EXPECT_EQ(io::read_text((fs::path(kept) / "model.safetensors").string(), "test"), bytes);
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_EQ(list_checkpoints(run_dir_.string()), std::vector<std::string>{good});

  const std::string again = save(2);  // the resumed run reaches step 2
  EXPECT_EQ(newest_valid().value_or(""), again);
  bytes = io::read_text(model.string(), "test");
  bytes[bytes.size() / 2] ^= 0x10;
  io::write_text_atomic(model.string(), bytes, "test");
  damaged.clear();
  ASSERT_EQ(fs::path(newest_valid(&damaged).value_or("")), fs::path(good));
  EXPECT_EQ(fs::path(set_aside_damaged_checkpoint(damaged.at(0).dir)),
            checkpoints() / "damaged-step_00000002.2");
  EXPECT_TRUE(fs::is_directory(kept));
  remove_interrupted_saves(run_dir_.string());  // the start-up clean-up leaves them alone
  EXPECT_TRUE(fs::is_directory(kept));
  EXPECT_TRUE(fs::is_directory(checkpoints() / "damaged-step_00000002.2"));
}

}  // namespace
}  // namespace moecore
