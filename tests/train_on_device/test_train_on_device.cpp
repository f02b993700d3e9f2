// The training job with its model on device memory (train.device = "cuda"), run on the guarded
// device (tests/cpp/guarded_device.h: host pages the host cannot touch outside the operations),
// against the same job on the host: every part of the job that reads or writes the model from the
// host (initialisation, checkpoints and their resume, evaluation, the generated sample, the
// router-bias update, the MoE statistics, --init-from with its round-trip check, and with two
// processes the gradient reductions, ZeRO-1's shards and the pipeline's activations, which MPI
// moves through host copies of the device buffers) has to copy through the device's memory, or
// the run crashes at that line. The runs must then agree bit for bit: the checkpoints' files, byte
// for byte, and every logged loss. The two-process cases run under mpirun (ctest
// TrainOnDevice.TwoRanks) and skip in any other world. The cases with parallel.communicator =
// "nccl" register a stand-in for NCCL's communicator (dist/device_communicators.h; no GPU here):
// the job must build its world, dp, ep and ep_dp groups from it, its pp group from MPI's world,
// name it in the start-up line, and still match the host's run (which leaves the key out).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/splitmix64.h"
#include "data/bpe_trainer.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "dist/device_communicators.h"
#include "dist/mpi/mpi_runtime.h"
#include "guarded_device.h"
#include "kernels/loss_parts.h"
#include "stream_ordered_stand_in.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

struct DeviceRunCase {
  std::string name;
  std::string precision;
  std::string recompute;
  int ranks = 1;           // processes (mpirun -n); the case skips in any other world
  std::string parallel;    // the [parallel] table
  int64_t head_chunk = 0;  // train.lm_head_chunk_tokens
  std::string train{};     // more [train] keys
  int64_t eval_every = 2;  // train.eval_every
  std::string data{};      // more [data] keys
};

void PrintTo(const DeviceRunCase& c, std::ostream* out) {
  *out << c.name;
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// This rank's traffic of a run (out_dir/rank_stats: bytes and calls per "group.op"), without
// the stand-in's MPI transport (its groups' own names count what the job issued).
nlohmann::json issued_traffic(const fs::path& out_dir, int rank) {
  nlohmann::json traffic = nlohmann::json::parse(
      read_file(out_dir / "rank_stats" / fmt::format("rank{}.json", rank)))["traffic"];
  for (auto it = traffic.begin(); it != traffic.end();)
    it = it.key().find("stand-in") != std::string::npos ? traffic.erase(it) : std::next(it);
  return traffic;
}

// The lines of metrics.jsonl without the wall-clock figures (times, rates, memory, the pipeline's
// bubble), which differ from run to run.
std::vector<nlohmann::json> logged_values(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    nlohmann::json values = nlohmann::json::parse(line);
    for (auto it = values.begin(); it != values.end();) {
      const std::string& key = it.key();
      const bool wall_clock =
          key.find("seconds") != std::string::npos || key.find("per_s") != std::string::npos ||
          key.find("memory") != std::string::npos || key.find("time") != std::string::npos ||
          key.find("bubble") != std::string::npos;
      it = wall_clock ? values.erase(it) : std::next(it);
    }
    lines.push_back(std::move(values));
  }
  return lines;
}

// Every regular file under a checkpoint directory, by relative path, with its bytes.
std::vector<std::pair<std::string, std::string>> checkpoint_files(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      files.emplace_back(fs::relative(entry.path(), dir).string(), read_file(entry.path()));
  std::sort(files.begin(), files.end());
  return files;
}

// The lines of a run's output that say what it made or failed to make: the sample and any
// warning (a part of the job that failed on device memory and only warned, as the sample does).
std::vector<std::string> sample_and_warnings(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("sample: ") || line.find("warning") != std::string::npos)
      lines.push_back(line);
  return lines;
}

// The stand-in for NCCL's communicator (stream_ordered_stand_in.h): the bootstrap's own ranks
// split off over MPI, which stages the guarded device's buffers through host memory, their
// operations recorded into a step graph's capture. Counts the worlds the trainer made with it.
int g_stand_in_worlds = 0;
std::unique_ptr<dist::Communicator> stand_in_world(const dist::Communicator& bootstrap,
                                                   const std::string& group) {
  ++g_stand_in_worlds;
  return std::make_unique<StreamOrderedStandIn>(
      bootstrap.split(0, bootstrap.rank(), group + " (stand-in's MPI)"), group);
}
constexpr dist::DeviceCommunicatorFactory kStandIn{.name = "nccl", .create = &stand_in_world};

// A table's lines without those that set `key` (the host's run: parallel.communicator = "nccl"
// and train.cuda_graph need a device).
std::string without_key(const std::string& table, const std::string& key) {
  std::istringstream in(table);
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (!line.starts_with(key)) kept += line + "\n";
  return kept;
}

// A device run's [parallel] table as the host runs it: MPI's groups, and the symmetric
// transport's blocks by MPI's all-to-all (the padded transport: the same blocks).
std::string host_parallel(const std::string& table) {
  std::string host = without_key(table, "communicator");
  const std::string symmetric = "rowwise_transport = \"symmetric\"";
  if (const size_t at = host.find(symmetric); at != std::string::npos)
    host.replace(at, symmetric.size(), "rowwise_transport = \"padded\"");
  return host;
}

// train() with its standard output kept.
TrainSummary train_capturing(const RunConfig& config, const TrainOptions& options,
                             std::string& output) {
  ::testing::internal::CaptureStdout();
  try {
    const TrainSummary summary = train(config, options);
    output += ::testing::internal::GetCapturedStdout();
    return summary;
  } catch (...) {
    output += ::testing::internal::GetCapturedStdout();
    throw;
  }
}

class TrainOnDevice : public ::testing::TestWithParam<DeviceRunCase> {
 protected:
  void SetUp() override {
    world_ = dist::mpi_world();
    if (world_->size() != GetParam().ranks)
      GTEST_SKIP() << "runs in " << GetParam().ranks << " processes (mpirun -n " << GetParam().ranks
                   << "), not " << world_->size();
    // Rank 0 names the directory and writes the inputs; the others wait for them.
    int64_t owner_pid = ::getpid();
    world_->broadcast(&owner_pid, sizeof(owner_pid), 0);
    dir_ = fs::temp_directory_path() /
           fmt::format("moecore_train_on_device_{}_{}", owner_pid, GetParam().name);
    if (world_->rank() == 0) write_inputs();
    world_->barrier();
    eos_id_ = data::Tokenizer::load((dir_ / "tokenizer.json").string()).eos_id();
  }
  void TearDown() override {
    if (!world_ || world_->size() != GetParam().ranks) return;
    world_->barrier();
    if (world_->rank() == 0) fs::remove_all(dir_);
  }

  void write_inputs() const {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A tokenizer for the sample, and random tokens below its vocabulary.
    const data::Tokenizer tokenizer = data::train_bpe_from_texts(
        {"In the beginning God created the heaven and the earth. And the earth was without form, "
         "and void; and darkness was upon the face of the deep."},
        300, {"<|endoftext|>"});
    tokenizer.save((dir_ / "tokenizer.json").string());
    SplitMix64 rng(5);
    for (const char* name : {"train.npy", "val.npy"}) {
      std::vector<uint16_t> tokens(48 * 64);
      for (uint16_t& token : tokens) token = static_cast<uint16_t>(rng.bounded(300));
      // Documents of 1 to 40 tokens, each ending with EOS (data.document_masking).
      for (size_t at = rng.bounded(40); at < tokens.size(); at += 1 + rng.bounded(40))
        tokens[at] = static_cast<uint16_t>(tokenizer.eos_id());
      std::ofstream file(dir_ / name, std::ios::binary);
      file.write(reinterpret_cast<const char*>(tokens.data()),
                 static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    }
    // A downstream task (train.downstream_tasks, "@DIR@/task" in a case): five documents of
    // three continuations each, one context longer than seq_len (cut from the left).
    fs::create_directories(dir_ / "task");
    std::ofstream task(dir_ / "task" / "requests.jsonl");
    const std::vector<std::string> contexts = {"In the beginning God", "And the earth was",
                                               "darkness was upon the face", "And God said",
                                               std::string(200, 'a') + " and the deep"};
    const std::vector<std::string> continuations = {" created", " without form", " of the deep"};
    for (size_t d = 0; d < contexts.size(); ++d)
      for (size_t i = 0; i < continuations.size(); ++i)
        task << nlohmann::json{{"request_type", "loglikelihood"},
                               {"doc_id", d},
                               {"idx", i},
                               {"label", d % continuations.size()},
                               {"request",
                                {{"context", contexts[d]}, {"continuation", continuations[i]}}}}
                    .dump()
             << "\n";
  }

  // A small MoE model with every part the job reads from the host: a dense first layer, routed
  // experts with a shared expert and the auxiliary-loss-free router bias, GQA with QK-norm, the
  // LM head's z-loss, validation, two checkpoints and the sample. 10 experts: no per-expert read
  // (8 bytes an expert, 5 per rank under ep = 2) has the size of the step's two copies the test
  // finds by size (the losses' 64 bytes, the decision's 24).
  RunConfig config(const std::string& device, const std::string& out, int64_t max_steps) const {
    const DeviceRunCase& c = GetParam();
    return parse_run_config(
        fmt::format(R"([model]
vocab_size = 300
hidden_size = 64
num_hidden_layers = 3
num_attention_heads = 4
num_key_value_heads = 2
tie_word_embeddings = false
num_experts = 10
num_experts_per_tok = 2
moe_intermediate_size = 32
intermediate_size = 96
first_k_dense_replace = 1
shared_expert_intermediate_size = 32
router_aux_loss_coef = 0.01
router_z_loss_coef = 0.001
router_bias_update_rate = 0.001
qk_norm = "full"

[optim]
lr = 3e-3
weight_decay = 0.1
max_grad_norm = 1.0
warmup_steps = 2

[train]
seed = 7
max_steps = {}
batch_size = 4
microbatches = 2
seq_len = 64
threads = 2
log_every = 1
profile = true
eval_every = {}
eval_batches = 2
save_every = 2
keep_last = 0
gerrymander_window = 2
sample_prompt = "In the beginning"
sample_tokens = 6
precision = "{}"
recompute = "{}"
lm_head_chunk_tokens = {}
z_loss_multiplier = 0.001
device = "{}"
out_dir = "{}"
{}

[data]
train = ["{}"]
val = ["{}"]
tokenizer = "{}"
dtype = "uint16"
eos_id = {}
{}
[parallel]
{}
)",
                    max_steps, c.eval_every, c.precision, c.recompute, c.head_chunk, device,
                    (dir_ / out).string(),
                    with_dir(device == "cpu" ? without_key(c.train, "cuda_graph") : c.train),
                    (dir_ / "train.npy").string(), (dir_ / "val.npy").string(),
                    (dir_ / "tokenizer.json").string(), eos_id_, with_dir(c.data),
                    device == "cpu" ? host_parallel(c.parallel) : c.parallel),
        "train_on_device");
  }

  // A case's [train] or [data] keys with "@DIR@" standing for the inputs' directory.
  std::string with_dir(std::string keys) const {
    for (size_t at = keys.find("@DIR@"); at != std::string::npos; at = keys.find("@DIR@"))
      keys.replace(at, 5, dir_.string());
    return keys;
  }

  std::unique_ptr<dist::Communicator> world_;
  fs::path dir_;
  int32_t eos_id_ = -1;  // the tokenizer's, which ends the documents of the token files
};

TEST_P(TrainOnDevice, JobMatchesTheHostsBitForBit) {
  // The host's run: 4 steps, then 2 more resumed from its step-4 checkpoint.
  std::string host_output, device_output;
  const TrainSummary host = train_capturing(config("cpu", "host", 4), {}, host_output);
  const nlohmann::json host_traffic = issued_traffic(dir_ / "host", world_->rank());
  TrainOptions resume;
  resume.resume = true;
  const TrainSummary host_resumed = train_capturing(config("cpu", "host", 6), resume, host_output);
  TrainSummary device, device_resumed, device_init;
  const bool stand_in = GetParam().parallel.find("communicator") != std::string::npos;
  g_stand_in_worlds = 0;
  const int64_t block_exchanges_before = StreamOrderedStandIn::block_exchanges();
  {
    const guarded_device::Scope guarded;
    if (stand_in) dist::register_device_communicator(Device::kCuda, &kStandIn);
    device = train_capturing(config("cuda", "device", 4), {}, device_output);
    // The same collectives as the host's, replayed steps counted too (StepGraph), where both
    // runs dispatch alike (the host's rowwise windows are the device's all-to-all-v).
    const std::string& parallel = GetParam().parallel;
    if (parallel.find("dispatch = \"rowwise\"") == std::string::npos ||
        parallel.find("\"padded\"") != std::string::npos ||
        parallel.find("\"symmetric\"") != std::string::npos) {
      EXPECT_EQ(issued_traffic(dir_ / "device", world_->rank()), host_traffic);
    }
    device_resumed = train_capturing(config("cuda", "device", 6), resume, device_output);
    // Initialised from the host's step-6 checkpoint read as a Hugging Face model.
    TrainOptions init;
    init.init_from = (dir_ / "host" / "checkpoints" / "step_00000006").string();
    std::string init_output;
    device_init = train_capturing(config("cuda", "device_init", 1), init, init_output);
    if (world_->rank() == 0) {  // rank 0 writes, reads back and reports the check
      EXPECT_NE(init_output.find("init-from self-check"), std::string::npos) << init_output;
    }
    dist::register_device_communicator(Device::kCuda, nullptr);
  }
  if (GetParam().train.find("cuda_graph") != std::string::npos && world_->rank() == 0) {
    // The first run's steps (rank 0 reports them): the first eager, the second captured, later
    // ones replayed until an evaluation (then one eager step again).
    const size_t at = device_output.find("cuda_graph: ");
    ASSERT_NE(at, std::string::npos) << device_output;
    EXPECT_GE(std::stoll(device_output.substr(at + 12)), 1) << device_output.substr(at, 120);
  }
  // The symmetric transport's blocks went through the group's device-initiated exchange (each
  // call counted once, at capture and not at replay).
  const int64_t block_exchanges = StreamOrderedStandIn::block_exchanges() - block_exchanges_before;
  if (GetParam().parallel.find("\"symmetric\"") != std::string::npos)
    EXPECT_GT(block_exchanges, 0);
  else
    EXPECT_EQ(block_exchanges, 0);
  if (stand_in) {
    EXPECT_EQ(g_stand_in_worlds, 3);  // the three runs on the device
    if (world_->rank() == 0) {
      const std::string line =
          world_->size() > 1 ? "communicator nccl\n" : "parallel: 1 rank; communicator nccl\n";
      EXPECT_NE(device_output.find(line), std::string::npos) << device_output;
      if (world_->size() > 1) {
        EXPECT_NE(host_output.find("communicator mpi\n"), std::string::npos) << host_output;
      }
    }
  } else {
    EXPECT_EQ(g_stand_in_worlds, 0);
  }
  const std::vector<std::string> host_lines = sample_and_warnings(host_output);
  // Rank 0 samples at the end of each run (the first and the resumed one).
  ASSERT_EQ(std::count_if(host_lines.begin(), host_lines.end(),
                          [](const std::string& line) { return line.starts_with("sample: "); }),
            world_->rank() == 0 ? 2 : 0)
      << host_output;
  EXPECT_EQ(sample_and_warnings(device_output), host_lines) << device_output;
  EXPECT_EQ(device.last_loss, host.last_loss);
  EXPECT_EQ(device.val_loss, host.val_loss);
  EXPECT_EQ(device_resumed.last_loss, host_resumed.last_loss);
  EXPECT_EQ(device_resumed.val_loss, host_resumed.val_loss);
  if (GetParam().train.find("skip_sigma") != std::string::npos) {
    // The guard skipped steps, the same ones on both (their warnings are compared above).
    EXPECT_GT(host_resumed.skipped_steps, 0) << host_output;
    EXPECT_EQ(device_resumed.skipped_steps, host_resumed.skipped_steps);
  }
  if (world_->rank() != 0) return;  // rank 0 writes the metrics and commits the checkpoints
  const std::vector<nlohmann::json> device_metrics =
      logged_values(dir_ / "device" / "metrics.jsonl");
  EXPECT_EQ(device_metrics, logged_values(dir_ / "host" / "metrics.jsonl"));
  if (GetParam().train.find("downstream_tasks") != std::string::npos) {
    // The tasks were scored at each evaluation (steps 2 and 4, and 6 resumed), not skipped.
    int64_t evaluations = 0;
    for (const nlohmann::json& line : device_metrics)
      for (const auto& [key, value] : line.items())
        evaluations += key.starts_with("eval/downstream/") && key.ends_with("accuracy)");
    EXPECT_EQ(evaluations, 3);
  }
  if (GetParam().data.find("lm_eval") != std::string::npos) {
    // The labelled sets were scored at each evaluation (steps 2 and 4, and 6 resumed).
    int64_t evaluations = 0;
    for (const nlohmann::json& line : device_metrics)
      evaluations += line.contains("eval/lm/val/CE loss");
    EXPECT_EQ(evaluations, 3);
  }
  if (GetParam().parallel.find("capacity_factor") != std::string::npos) {
    // The case is below capacity: every logged step drops routes (the host's and the device's
    // alike), steps 1-4 and the resumed 5-6 at least.
    int64_t steps = 0, steps_dropping = 0;
    for (const nlohmann::json& line : device_metrics) {
      if (!line.contains("moe/drop_rate")) continue;
      ++steps;
      if (line.at("moe/drop_rate").get<double>() > 0.0) ++steps_dropping;
    }
    EXPECT_GE(steps, 6);
    EXPECT_EQ(steps_dropping, steps);
  }
  // The checkpoints, and the merged ones of a case that merges (train.merge_steps), file by file.
  std::vector<fs::path> saved;
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006"})
    saved.push_back(fs::path("checkpoints") / step);
  if (fs::is_directory(dir_ / "host" / "merged" / "checkpoints"))
    for (const auto& entry : fs::directory_iterator(dir_ / "host" / "merged" / "checkpoints"))
      saved.push_back(fs::path("merged") / "checkpoints" / entry.path().filename());
  EXPECT_EQ(GetParam().train.find("merge_steps") != std::string::npos,
            saved.size() > 3);  // a merging case merged
  for (const fs::path& step : saved) {
    SCOPED_TRACE(step.string());
    ASSERT_TRUE(fs::is_directory(dir_ / "device" / step));
    const auto device_files = checkpoint_files(dir_ / "device" / step);
    const auto host_files = checkpoint_files(dir_ / "host" / step);
    ASSERT_EQ(device_files.size(), host_files.size());
    for (size_t i = 0; i < host_files.size(); ++i) {
      EXPECT_EQ(device_files[i].first, host_files[i].first);
      // config.toml names the device and the run directory (and so has its own CRC in
      // checksums.json); everything else is the same.
      if (host_files[i].first == "checksums.json") {
        nlohmann::json device_sums = nlohmann::json::parse(device_files[i].second);
        nlohmann::json host_sums = nlohmann::json::parse(host_files[i].second);
        device_sums["files"].erase("config.toml");
        host_sums["files"].erase("config.toml");
        EXPECT_EQ(device_sums, host_sums);
      } else if (host_files[i].first != "config.toml") {
        EXPECT_TRUE(device_files[i].second == host_files[i].second) << host_files[i].first;
      }
    }
  }
  // --init-from's first step starts from the host's weights (its round-trip check passed, or
  // train() would have thrown).
  EXPECT_EQ(device_init.steps, 1);
  EXPECT_TRUE(std::isfinite(device_init.last_loss));

  // train.profile's host reads of device memory (the resumed runs profile step 6, its metrics and
  // checkpoint), listed by first occurrence, so the step's come first: none on the host. On the
  // device no pass waits (kernels::moe_loss_terms keeps the losses where they are) and neither
  // does the update (kernels::step_decision decides it there); once all of the step is issued,
  // it reads its losses (one copy of the loss parts of every micro-batch) and its decision ([loss,
  // norm, applied]). In one process the step reads nothing else but MXFP8's weight-gradient loop
  // (the experts' offsets). With two, MPI stages the batch statistics' sums and the expert-parallel
  // exchange through the host, and where the norm's squares add up over ranks (ZeRO-1's slices,
  // experts over ep, stages) the optimizer reads them in one copy.
  const DeviceRunCase& c = GetParam();
  const nlohmann::json host_profile =
      nlohmann::json::parse(read_file(dir_ / "host" / "profile.json"));
  EXPECT_TRUE(host_profile.at("host_reads").empty()) << host_profile.dump(1);
  const nlohmann::json device_profile =
      nlohmann::json::parse(read_file(dir_ / "device" / "profile.json"));
  // Its phases timed by the device's clock (the guarded device's: kPhaseMarkSeconds a phase
  // scope, so whole multiples of it), not by the host's issuing of their work. Under
  // train.cuda_graph the profiled step 6 is captured: nothing in it is marked.
  EXPECT_EQ(host_profile.at("phase_clock"), "host wall clock");
  EXPECT_EQ(device_profile.at("phase_clock"), "guarded device's clock");
  const bool captured = c.train.find("cuda_graph") != std::string::npos;
  for (const auto& [phase, seconds] : device_profile.at("phases").items()) {
    if (phase == "other") continue;
    const double marks = seconds.get<double>() / guarded_device::kPhaseMarkSeconds;
    EXPECT_EQ(marks, std::round(marks)) << phase << ": " << seconds;
    if (captured) {
      EXPECT_EQ(marks, 0.0) << phase;
    }
  }
  if (!captured) {
    EXPECT_GT(device_profile.at("phases").at("attention_forward"), 0.0);
  }
  const std::string losses_copy =
      fmt::format("copy of {} bytes", 2 * kernels::kLossParts * sizeof(double));
  const std::string decision_copy = fmt::format("copy of {} bytes", 3 * sizeof(double));
  int64_t losses_copies = 0, decision_copies = 0, norm_copies = 0, cross_entropies = 0;
  int64_t in_layers = 0;
  bool in_the_step = true;  // before the decision's copy, the step's last read
  for (const nlohmann::json& read : device_profile.at("host_reads")) {
    const std::string phase = read.at("phase"), what = read.at("what");
    const int64_t count = read.at("count");
    const bool losses = phase == "none" && what == losses_copy;
    const bool decision = phase == "none" && what == decision_copy;
    if (losses) losses_copies += count;
    if (decision) decision_copies += count;
    if (phase == "optimizer" && what == "copy of 16 bytes") norm_copies += count;
    if (phase == "lm_head_forward" && what == "cross_entropy") cross_entropies += count;
    bool layer = false;
    for (const char* prefix :
         {"attention_", "router_", "dispatch_", "experts_", "shared_expert_", "combine_"})
      layer |= phase.starts_with(prefix);
    if (layer) in_layers += count;
    // The padded transport plans on the device: in the layers only MPI's staging of the
    // all-gathered counts and the exchanged blocks reads (none with NCCL, which takes the
    // device's buffers as they are).
    if (layer && c.parallel.find("\"padded\"") != std::string::npos) {
      EXPECT_TRUE(what.ends_with(" for MPI staging")) << phase << ": " << what << "\n"
                                                      << device_profile.dump(1);
    }
    if (c.ranks == 1 && in_the_step && !losses && !decision) {
      EXPECT_TRUE(c.precision == "mxfp8" && phase == "experts_backward")
          << phase << ": " << what << "\n"
          << device_profile.dump(1);
    }
    in_the_step &= !decision;
  }
  // Step 6's two micro-batches in one copy, and its decision in another.
  EXPECT_EQ(losses_copies, 1) << device_profile.dump(1);
  EXPECT_EQ(decision_copies, 1) << device_profile.dump(1);
  EXPECT_EQ(cross_entropies, 0) << device_profile.dump(1);  // its loss is in the copy
  if (c.ranks == 1 && c.precision != "mxfp8") {
    EXPECT_EQ(in_layers, 0) << device_profile.dump(1);
  }
  // With one stage the squares add up over ranks where they are (a collective on the device's
  // buffers, staged by MPI); the stages sum them on the host.
  EXPECT_EQ(norm_copies, c.parallel.find("pp = 2") != std::string::npos ? 1 : 0)
      << device_profile.dump(1);
}

INSTANTIATE_TEST_SUITE_P(
    TrainJob, TrainOnDevice,
    ::testing::Values(
        DeviceRunCase{"fp32", "fp32", "none", 1, ""},
        // The LM head in chunks of 48 of the micro-batch's 128 tokens (the last one shorter);
        // with two pipeline stages below, in chunks of 40 on the last.
        DeviceRunCase{"bf16", "bf16", "full", 1, "", 48},
        DeviceRunCase{"mxfp8", "mxfp8", "none", 1, ""},
        // A spike guard that skips steps (a band of 1e-4 x 1% of the mean over one step): the
        // decision where the gradients are (kernels::step_decision) leaves the weights, moments
        // and bias of a skipped step as they were, as the host's does.
        DeviceRunCase{"fp32_skips", "fp32", "none", 1, "", 0,
                      "skip_sigma = 0.0001\nskip_window = 8\nskip_min_window = 1"},
        // The same under OLMo-core's rule: the cross-entropy judged (step_decision's other loss
        // coefficients at 0), skipped steps in the window, judged from step 3 of a window of 6.
        DeviceRunCase{"fp32_olmo_core_skips", "fp32", "none", 1, "", 0,
                      "skip_rule = \"olmo-core\"\nskip_sigma = 0.0001\nskip_window = 6"},
        // OLMo-core's optimizer groups (their coefficients staged where the parameters are), its
        // model merging (the sums kept and averaged in device memory; windows before steps 3 and
        // 6, the second merged by the resumed run) and its stability monitor.
        DeviceRunCase{"bf16_groups_merge_spikes", "bf16", "none", 1, "", 0,
                      "merge_steps = [3, 6]\nmerge_last_n_steps = 2\nstability_monitor = true\n"
                      "spike_window = 2\nspike_rolling_window = 3\n"
                      "[[optim.group_overrides]]\nparams = [\"blocks.*.routed_experts.*\"]\n"
                      "lr = 1e-3\nbeta1 = 0.8\n[[optim.group_overrides]]\n"
                      "params = [\"model.embed_tokens.weight\"]\nweight_decay = 0.0"},
        // Every step as one graph (train.cuda_graph; the guarded device's emulated capture):
        // captured at step 2, replayed at 3; the evaluation after step 3 sends step 4 back to an
        // eager run. And with the guard skipping steps, so that its limits change every step and
        // a replay must read them anew; in bf16 with the chunked head and full recompute,
        // evaluated only at the end (steps 3 and 4 replayed).
        DeviceRunCase{"fp32_cuda_graph", "fp32", "none", 1, "", 0, "cuda_graph = true", 3},
        DeviceRunCase{"fp32_cuda_graph_skips", "fp32", "none", 1, "", 0,
                      "cuda_graph = true\nskip_sigma = 0.0001\nskip_window = 8\n"
                      "skip_min_window = 1",
                      6},
        DeviceRunCase{"bf16_cuda_graph", "bf16", "full", 1, "", 48, "cuda_graph = true", 6},
        // With document masking: each micro-batch's documents found when it is staged, read by
        // the captured attention (and its recompute) from a static buffer.
        DeviceRunCase{"fp32_cuda_graph_documents", "fp32", "full", 1, "", 0, "cuda_graph = true", 6,
                      "document_masking = true"},
        // Two processes: data parallel with ZeRO-1's shards, data parallel with
        // the reduction overlapped with the backward, two pipeline stages, the
        // experts split over the two (the sync dispatch's all-to-all of rows).
        DeviceRunCase{"ranks2_dp_zero", "fp32", "none", 2, "zero = 1"},
        DeviceRunCase{"ranks2_dp_overlap_bf16", "bf16", "none", 2, "overlap_grad_reduce = true"},
        DeviceRunCase{"ranks2_pp", "fp32", "full", 2, "pp = 2", 40},
        DeviceRunCase{"ranks2_ep_sync", "bf16", "none", 2, "ep = 2"},
        // The rowwise dispatch below capacity (routes dropped): on the device its
        // all-to-all-v form against the host's MPI windows.
        DeviceRunCase{"ranks2_ep_rowwise_drops", "fp32", "none", 2,
                      "ep = 2\ndispatch = \"rowwise\"\ncapacity_factor = 0.75"},
        // Its padded transport (kernels' padded_dispatch_plan on the device, an all-to-all of
        // static blocks) against the same on the host, routes dropped, bf16 experts.
        DeviceRunCase{"ranks2_ep_rowwise_padded_drops", "bf16", "none", 2,
                      "ep = 2\ndispatch = \"rowwise\"\ncapacity_factor = 0.75\n"
                      "rowwise_transport = \"padded\""},
        // The stand-in for NCCL's communicator: one process; experts split over
        // two ranks with ZeRO-1 (all-to-all-v over ep, reduce-scatter and
        // all-gather over dp). Pipeline stages keep a job on MPI
        // (train/communicator_choice.h).
        DeviceRunCase{"fp32_nccl_stand_in", "fp32", "none", 1, "communicator = \"nccl\""},
        // OLMo-core's downstream evaluation (train.downstream_tasks): the queries' logits copied
        // from device memory and scored on the host, pmi_dc's second pass; over two ranks each
        // data-parallel rank's share gathered through the stand-in's all-reduce of host memory,
        // and through two pipeline stages (the last one's scores broadcast).
        DeviceRunCase{"bf16_downstream", "bf16", "none", 1, "", 0,
                      "[[train.downstream_tasks]]\npath = \"@DIR@/task\"\nmetric = \"pmi_dc\""},
        DeviceRunCase{"ranks2_dp_downstream_nccl_stand_in", "fp32", "none", 2,
                      "communicator = \"nccl\"", 0,
                      "[[train.downstream_tasks]]\npath = \"@DIR@/task\"\nmetric = \"acc\""},
        DeviceRunCase{"ranks2_pp_downstream", "fp32", "none", 2, "pp = 2", 0,
                      "[[train.downstream_tasks]]\npath = \"@DIR@/task\"\nmetric = \"len_norm\""},
        // OLMo-core's LM evaluator (data.lm_eval): two labelled sets, each document its own
        // instance, passes of one label's documents (forward with targets, the losses read from
        // device memory with the step's); over two ranks each data-parallel rank's share of the
        // passes summed through the stand-in's all-reduce, and through two pipeline stages (the
        // last one's losses broadcast).
        DeviceRunCase{"bf16_lm_eval", "bf16", "none", 1, "", 0, "lm_eval_batches = 3", 2,
                      "[[data.lm_eval]]\nlabel = \"val\"\npaths = [\"@DIR@/val.npy\"]\n"
                      "[[data.lm_eval]]\nlabel = \"train\"\npaths = [\"@DIR@/train.npy\"]"},
        DeviceRunCase{"ranks2_dp_lm_eval_nccl_stand_in", "fp32", "none", 2,
                      "communicator = \"nccl\"", 0, "", 2,
                      "[[data.lm_eval]]\nlabel = \"val\"\npaths = [\"@DIR@/val.npy\"]"},
        DeviceRunCase{"ranks2_pp_lm_eval", "fp32", "none", 2, "pp = 2", 0, "", 2,
                      "[[data.lm_eval]]\nlabel = \"val\"\npaths = [\"@DIR@/val.npy\"]"},
        // Both evaluators over the experts split between the two ranks: each rank its share of
        // the passes, in lockstep (the same forwards' shapes: the exchange is collective).
        DeviceRunCase{"ranks2_ep_lm_eval_downstream", "fp32", "none", 2, "ep = 2", 0,
                      "[[train.downstream_tasks]]\npath = \"@DIR@/task\"\nmetric = \"acc\"", 2,
                      "[[data.lm_eval]]\nlabel = \"val\"\npaths = [\"@DIR@/val.npy\"]"},
        DeviceRunCase{"ranks2_ep_zero_nccl_stand_in", "fp32", "none", 2,
                      "ep = 2\nzero = 1\ncommunicator = \"nccl\""},
        // The padded transport over the stand-in: what a GPU job without symmetric memory runs.
        DeviceRunCase{"ranks2_ep_padded_nccl_stand_in", "fp32", "none", 2,
                      "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"padded\"\n"
                      "communicator = \"nccl\""},
        // Every step as one graph in two processes, the stand-in's collectives captured with the
        // kernels (steps 3 and 4 replayed; 5 eager and 6 captured on resume): data parallel with
        // ZeRO-1's shards; the experts over two ranks through the padded transport with routes
        // dropped, the dense gradients' reduction overlapped with the backward, in bf16.
        DeviceRunCase{"ranks2_dp_zero_cuda_graph", "fp32", "none", 2,
                      "zero = 1\ncommunicator = \"nccl\"", 0, "cuda_graph = true", 6},
        DeviceRunCase{"ranks2_ep_padded_overlap_cuda_graph", "bf16", "none", 2,
                      "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"padded\"\n"
                      "capacity_factor = 0.75\noverlap_grad_reduce = true\n"
                      "communicator = \"nccl\"",
                      0, "cuda_graph = true", 6},
        // The symmetric transport (its device-initiated exchange made by the stand-in, the
        // blocks moved by its all-to-all), eager and captured, routes dropped: the host runs the
        // padded transport, the same blocks.
        DeviceRunCase{"ranks2_ep_symmetric_cuda_graph", "fp32", "none", 2,
                      "ep = 2\ndispatch = \"rowwise\"\nrowwise_transport = \"symmetric\"\n"
                      "capacity_factor = 0.75\ncommunicator = \"nccl\"",
                      0, "cuda_graph = true", 6}),
    [](const ::testing::TestParamInfo<DeviceRunCase>& param_info) {
      return param_info.param.name;
    });

// Two processes whose groups are MPI's (no device communicator registered): a step graph cannot
// capture their collectives, which run on the host, so the job stops in one line before it
// touches its data or its run directory. (Its name puts it under mpirun: ctest
// TrainOnDevice.TwoRanks.)
TEST(TrainOnDeviceGraph, ranks2_cuda_graph_over_mpi_is_refused_in_one_line) {
  const std::unique_ptr<dist::Communicator> world = dist::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "runs in 2 processes (mpirun -n 2)";
  const guarded_device::Scope guarded;
  const fs::path out = fs::temp_directory_path() / "moecore_graph_over_mpi_never_written";
  const RunConfig config =
      parse_run_config(fmt::format(R"([train]
device = "cuda"
cuda_graph = true
out_dir = "{}"
[data]
train = ["{}"]
)",
                                   out.string(), (out / "absent.npy").string()),
                       "graph_over_mpi");
  std::string e;
  try {
    train(config, {});
  } catch (const Error& error) {
    e = error.what();
  }
  EXPECT_NE(e.find("[config] train.cuda_graph=true with 2 processes needs the device's "
                   "communicator (parallel.communicator=\"nccl\"; this job's: mpi"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace moecore
