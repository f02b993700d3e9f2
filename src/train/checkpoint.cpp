#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "io/file_util.h"
#include "io/model_weights.h"
#include "io/safetensors.h"
#include "io/tensor_parts.h"

namespace moecore {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step_";
constexpr const char* kTempPrefix = ".tmp-step_";
// A complete checkpoint moved aside while the same step is saved again; restored if the new one
// never arrives.
constexpr const char* kReplacedPrefix = ".replaced-";

std::string checkpoints_dir(const std::string& run_dir) {
  return run_dir + "/checkpoints";
}

void write_text(const std::string& path, const std::string& text) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  const std::span<const std::byte> chunks[] = {bytes};
  io::write_file_atomic(path, chunks, "[checkpoint]");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "[checkpoint] cannot read '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  MOE_CHECK(fd >= 0, "[checkpoint] cannot open directory '{}' to sync it", dir);
  const int rc = ::fsync(fd);
  const int err = errno;  // before close() can change it
  ::close(fd);
  MOE_CHECK(rc == 0 || err == EINVAL, "[checkpoint] fsync of directory '{}' failed", dir);
}

// Weights (and, with an optimizer, Adam moments) of the tensors this part holds.
void write_part_files(const std::string& dir, const CheckpointPart& part) {
  io::SafetensorsWriter model, optim;
  model.set_metadata("format", "pt");
  if (part.optimizer != nullptr)
    optim.set_metadata("steps_taken", std::to_string(part.optimizer->steps_taken()));
  for (const ParamSpec& spec : part.layout->specs()) {
    if (spec.group == ParamGroup::kDense && !part.with_dense) continue;
    model.add_f32(spec.name, spec.shape, part.params->at(spec));
    if (part.optimizer == nullptr) continue;
    optim.add_f32("exp_avg." + spec.name, spec.shape, part.optimizer->exp_avg().at(spec));
    optim.add_f32("exp_avg_sq." + spec.name, spec.shape, part.optimizer->exp_avg_sq().at(spec));
  }
  model.write(dir + "/" + io::part_file_name("model", part.index, part.count));
  if (part.optimizer != nullptr)
    optim.write(dir + "/" + io::part_file_name("optim", part.index, part.count));
}

void load_optimizer(const std::string& dir, const ParamLayout& layout, AdamW& optimizer) {
  const io::TensorParts parts = io::TensorParts::open(dir, "optim");
  for (const ParamSpec& spec : layout.specs()) {
    parts.read_f32("exp_avg." + spec.name, spec.shape, optimizer.exp_avg().at(spec));
    parts.read_f32("exp_avg_sq." + spec.name, spec.shape, optimizer.exp_avg_sq().at(spec));
  }
  const auto it = parts.metadata().find("steps_taken");
  MOE_CHECK(it != parts.metadata().end(), "[checkpoint] {}: no steps_taken in the metadata",
            parts.origin());
  optimizer.set_steps_taken(std::stoll(it->second));
}

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kPrefix, static_cast<long long>(step));
  return name;
}

}  // namespace

std::string checkpoint_staging_dir(const std::string& run_dir, int64_t step) {
  // One staging directory per step: every writing rank of a multi-rank save finds it by name.
  return checkpoints_dir(run_dir) + "/" + kTempPrefix +
         step_name(step).substr(std::string(kPrefix).size()) + "-staging";
}

std::string begin_checkpoint(const std::string& run_dir, int64_t step) {
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  MOE_CHECK(!ec, "[checkpoint] cannot create '{}': {}", parent, ec.message());
  const std::string staging = checkpoint_staging_dir(run_dir, step);
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  MOE_CHECK(!ec, "[checkpoint] cannot create '{}': {}", staging, ec.message());
  return staging;
}

void write_checkpoint_part(const std::string& staging_dir, const CheckpointPart& part) {
  write_part_files(staging_dir, part);
}

std::string commit_checkpoint(const std::string& run_dir, int64_t step,
                              const std::string& staging_dir, const CheckpointContents& c,
                              int64_t parts, const std::map<std::string, int64_t>& part_of,
                              int64_t keep_last) {
  const std::string parent = checkpoints_dir(run_dir);
  const std::string name = step_name(step);
  const std::string final_dir = parent + "/" + name;
  const std::string stale_dir = parent + "/" + kReplacedPrefix + name;
  std::error_code ec;
  try {
    if (parts > 1) {
      // The parts' index, in the Hugging Face format; the optimizer's mirrors it.
      std::map<std::string, std::string> model_map, optim_map;
      int64_t bytes = 0;
      for (const ParamSpec& spec : c.layout->specs()) {
        const auto it = part_of.find(spec.name);
        MOE_CHECK(it != part_of.end(), "[checkpoint] tensor '{}' belongs to no part", spec.name);
        model_map[spec.name] = io::part_file_name("model", it->second, parts);
        const std::string optim_file = io::part_file_name("optim", it->second, parts);
        optim_map["exp_avg." + spec.name] = optim_file;
        optim_map["exp_avg_sq." + spec.name] = optim_file;
        bytes += static_cast<int64_t>(spec.numel) * 4;
      }
      io::write_part_index(staging_dir, "model", model_map, bytes);
      if (c.optimizer != nullptr) io::write_part_index(staging_dir, "optim", optim_map, 2 * bytes);
    }
    write_text(staging_dir + "/config.json", c.hf_config.dump(2) + "\n");
    write_text(staging_dir + "/config.toml", run_config_to_toml(*c.config));
    if (!c.tokenizer_json.empty()) write_text(staging_dir + "/tokenizer.json", c.tokenizer_json);
    // Written last: its presence marks a complete checkpoint even before the rename.
    write_text(staging_dir + "/trainer_state.json", c.trainer_state.dump(2) + "\n");
    fsync_directory(staging_dir);
    if (fs::exists(final_dir)) {
      // The same step saved again (a resumed run reaching it a second time): the old copy is
      // moved aside, not deleted, until the new one is in place.
      fs::rename(final_dir, stale_dir);
      fs::rename(staging_dir, final_dir);
      fsync_directory(parent);
      fs::remove_all(stale_dir, ec);
    } else {
      fs::rename(staging_dir, final_dir);
    }
    fsync_directory(parent);
  } catch (...) {
    fs::remove_all(staging_dir, ec);
    if (!fs::exists(final_dir, ec) && fs::exists(stale_dir, ec))
      fs::rename(stale_dir, final_dir, ec);
    throw;
  }
  // Pruning: each old checkpoint is first renamed to a temporary name (atomic, then fsynced), so a
  // crash part-way through its deletion never leaves an incomplete step_* directory behind;
  // remove_interrupted_saves() finishes the job at the next start.
  // Only checkpoints older than the new one count: newer ones (left by a run that resumed from an
  // older checkpoint) are kept until this run reaches and replaces them.
  std::vector<std::string> older;
  for (const std::string& dir : list_checkpoints(run_dir))
    if (fs::path(dir).filename().string() < name) older.push_back(dir);
  for (size_t i = 0; keep_last > 0 && i + static_cast<size_t>(keep_last) < older.size() + 1; ++i) {
    const std::string doomed =
        parent + "/" + kTempPrefix + "pruned-" + fs::path(older[i]).filename().string();
    fs::rename(older[i], doomed, ec);
    if (ec) continue;
    fsync_directory(parent);
    fs::remove_all(doomed, ec);
  }
  return final_dir;
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& c,
                            int64_t keep_last) {
  const std::string staging = begin_checkpoint(run_dir, step);
  try {
    write_checkpoint_part(staging, {0, 1, c.layout, c.params, c.optimizer, true});
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw;
  }
  return commit_checkpoint(run_dir, step, staging, c, 1, {}, keep_last);
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> dirs;
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind(kPrefix, 0) == 0) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort chronologically
  return dirs;
}

std::optional<std::string> latest_valid_checkpoint(const std::string& run_dir,
                                                   std::vector<std::string>* damaged) {
  std::vector<std::string> dirs = list_checkpoints(run_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    try {
      const nlohmann::json state = nlohmann::json::parse(read_text(*it + "/trainer_state.json"));
      MOE_CHECK(state.contains("step"), "[checkpoint] no step");
      io::TensorParts::open(*it, "model");
      io::TensorParts::open(*it, "optim");
      parse_run_config(read_text(*it + "/config.toml"), *it + "/config.toml");
      return *it;
    } catch (const std::exception& e) {
      // Damaged (edited by hand, a failing disk): fall back to an older one, and say so.
      if (damaged != nullptr) damaged->push_back(*it + ": " + e.what());
    }
  }
  return std::nullopt;
}

nlohmann::json load_checkpoint(const std::string& dir, const ModelConfig& expected,
                               const ParamLayout& layout, ParamBuffers& params, AdamW* optimizer) {
  const RunConfig saved = parse_run_config(read_text(dir + "/config.toml"), dir + "/config.toml");
  const std::string difference = model_config_difference(saved.model, expected);
  MOE_CHECK(difference.empty(),
            "[checkpoint] {} was written for another architecture ({} in checkpoint vs config)",
            dir, difference);
  io::load_weights_from_dir(layout, dir, params);
  if (optimizer != nullptr) load_optimizer(dir, layout, *optimizer);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_text(dir + "/trainer_state.json"));
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}/trainer_state.json is not valid JSON: {}", dir, e.what());
  }
  return state;
}

void remove_interrupted_saves(const std::string& run_dir) {
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kTempPrefix, 0) == 0) {
      fs::remove_all(entry.path(), ec);
    } else if (name.rfind(kReplacedPrefix, 0) == 0) {
      // Interrupted between moving the old copy aside and moving the new one in.
      const std::string original = parent + "/" + name.substr(std::string(kReplacedPrefix).size());
      if (fs::exists(original, ec))
        fs::remove_all(entry.path(), ec);
      else
        fs::rename(entry.path(), original, ec);
    }
  }
}

}  // namespace moecore
