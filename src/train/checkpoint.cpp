#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <tuple>

#include "core/check.h"
#include "core/escape.h"
#include "core/finite.h"
#include "io/file_checksums.h"
#include "io/file_util.h"
#include "io/hf_side_files.h"
#include "io/safetensors.h"
#include "io/tensor_parts.h"
#include "train/trainer_state.h"

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

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  MOE_CHECK(fd >= 0, "[checkpoint] cannot open directory '{}' to sync it", dir);
  const int rc = ::fsync(fd);
  const int err = errno;  // before close() can change it
  ::close(fd);
  MOE_CHECK(rc == 0 || err == EINVAL, "[checkpoint] fsync of directory '{}' failed", dir);
}

// The side file in which the writer of part `index` leaves its files' checksums for the commit,
// which folds them into checksums.json and removes it.
std::string part_checksums_file(int64_t index, int64_t count) {
  return fmt::format(".checksums-part-{:05d}-of-{:05d}.json", index + 1, count);
}

// Weights (and, with an optimizer, Adam moments) of the tensors this part holds, then their
// checksums, read back by the process that wrote them (every rank its own, in parallel).
// Every optimizer part carries the step count, so any one of them can be read first.
void write_part_files(const std::string& dir, const CheckpointPart& part) {
  std::vector<std::string> written = {io::part_file_name("model", part.index, part.count)};
  io::SafetensorsWriter model, optim;
  // A run whose values stopped being numbers (diverged with the step guard off, or resumed from
  // such a checkpoint) saves nothing: its checkpoints would push the good ones out (keep_last).
  model.require_finite();
  optim.require_finite();
  model.set_metadata("format", "pt");
  MOE_CHECK(part.weight_data.empty() || part.weight_data.size() == part.weights.size(),
            "[checkpoint] {} weight data for {} weights", part.weight_data.size(),
            part.weights.size());
  for (size_t i = 0; i < part.weights.size(); ++i) {
    const ParamSpec* spec = part.weights[i];
    model.add_f32(spec->name, spec->shape,
                  part.weight_data.empty() ? part.params->at(*spec) : part.weight_data[i]);
  }
  model.write(dir + "/" + written.back());
  if (part.steps_taken) {
    optim.set_metadata("steps_taken", std::to_string(*part.steps_taken));
    for (const StatePiece& piece : part.state) {
      const std::vector<int64_t> shape =
          piece.whole() ? piece.spec->shape
                        : std::vector<int64_t>{static_cast<int64_t>(piece.count)};
      optim.add_f32(state_piece_name("exp_avg", piece), shape, piece.exp_avg);
      optim.add_f32(state_piece_name("exp_avg_sq", piece), shape, piece.exp_avg_sq);
    }
    written.push_back(io::part_file_name("optim", part.index, part.count));
    optim.write(dir + "/" + written.back());
  }
  io::write_text_atomic(dir + "/" + part_checksums_file(part.index, part.count),
                        io::checksum_entries(dir, written, "[checkpoint]").dump() + "\n",
                        "[checkpoint]");
}

// The checksums the parts' writers left (part_checksums_file), removed from the directory.
nlohmann::json take_part_checksums(const std::string& dir, int64_t parts) {
  nlohmann::json known = nlohmann::json::object();
  for (int64_t i = 0; i < parts; ++i) {
    const std::string path = dir + "/" + part_checksums_file(i, parts);
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;  // recomputed by write_checksums
    try {
      known.update(nlohmann::json::parse(io::read_text(path, "[checkpoint]")));
    } catch (const nlohmann::json::exception&) {
      // recomputed by write_checksums
    }
    fs::remove(path, ec);
  }
  return known;
}

// The Hugging Face style index of the parts in `dir`, from their headers: every tensor to the part
// that holds it.
void index_parts(const std::string& dir, const std::string& stem, int64_t parts) {
  std::map<std::string, std::string> weight_map;
  int64_t bytes = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const std::string file = io::part_file_name(stem, i, parts);
    const io::SafetensorsReader reader = io::SafetensorsReader::open(dir + "/" + file);
    for (const std::string& name : reader.names()) {
      const auto [it, inserted] = weight_map.emplace(name, file);
      MOE_CHECK(inserted, "[checkpoint] tensor '{}' is in both {} and {}", name, it->second, file);
      bytes += static_cast<int64_t>(reader.info(name).end - reader.info(name).begin);
    }
  }
  io::write_part_index(dir, stem, weight_map, bytes);
}

// A count written by moecore into a checkpoint (a slice bound, the optimizer's step count): the
// whole text a decimal integer in [0, max], else an error naming the file, the key and the text.
uint64_t parse_count(std::string_view text, uint64_t max, const std::string& origin,
                     const std::string& key) {
  uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  MOE_CHECK(!text.empty() && ec == std::errc() && ptr == text.data() + text.size() && value <= max,
            "[checkpoint] {}: {}='{}' is not an integer in [0, {}]", origin, key, text, max);
  return value;
}

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kPrefix, static_cast<long long>(step));
  return name;
}

// A save never replaces what moecore did not write: a regular file, a symlink or anything else
// that is not a directory where the checkpoint of this step goes is an error, and stays.
void check_not_foreign(const std::string& final_dir, int64_t step) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(final_dir, ec);
  MOE_CHECK(!fs::exists(status) || fs::is_directory(status),
            "[checkpoint] cannot save step {}: {} exists and is not a checkpoint directory "
            "(moecore leaves it alone; move it away)",
            step, final_dir);
}

}  // namespace

std::string checkpoint_staging_dir(const std::string& run_dir, int64_t step, int64_t owner_pid) {
  return checkpoints_dir(run_dir) + "/" + kTempPrefix +
         step_name(step).substr(std::string(kPrefix).size()) + "-" + std::to_string(owner_pid) +
         "-staging";
}

std::string begin_checkpoint(const std::string& run_dir, int64_t step, int64_t owner_pid) {
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  MOE_CHECK(!ec, "[checkpoint] cannot create '{}': {}", parent, ec.message());
  check_not_foreign(parent + "/" + step_name(step), step);
  const std::string staging = checkpoint_staging_dir(run_dir, step, owner_pid);
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  MOE_CHECK(!ec, "[checkpoint] cannot create '{}': {}", staging, ec.message());
  return staging;
}

void write_checkpoint_part(const std::string& staging_dir, const CheckpointPart& part) {
  write_part_files(staging_dir, part);
}

void discard_checkpoint(const std::string& staging_dir) {
  std::error_code ec;
  fs::remove_all(staging_dir, ec);
}

std::string commit_checkpoint(const std::string& run_dir, int64_t step,
                              const std::string& staging_dir, const CheckpointContents& c,
                              int64_t parts, int64_t keep_last) {
  const std::string parent = checkpoints_dir(run_dir);
  const std::string name = step_name(step);
  const std::string final_dir = parent + "/" + name;
  const std::string stale_dir = parent + "/" + kReplacedPrefix + name;
  std::error_code ec;
  try {
    check_not_foreign(final_dir, step);
    if (parts > 1) {
      index_parts(staging_dir, "model", parts);
      if (fs::exists(staging_dir + "/" + io::part_file_name("optim", 0, parts)))
        index_parts(staging_dir, "optim", parts);
    }
    io::write_text_atomic(staging_dir + "/config.json", c.hf_config.dump(2) + "\n", "[checkpoint]");
    io::write_text_atomic(staging_dir + "/config.toml", run_config_to_toml(*c.config),
                          "[checkpoint]");
    if (!c.tokenizer_json.empty())
      io::write_text_atomic(staging_dir + "/tokenizer.json", c.tokenizer_json, "[checkpoint]");
    io::write_hf_side_files(staging_dir, c.hf_side_files, "[checkpoint]");
    // The trainer state promises the manifest written below (a checkpoint that lost it is
    // damaged, not one of an older moecore).
    nlohmann::json trainer_state = c.trainer_state;
    trainer_state["checksums"] = kChecksumsFile;
    io::write_text_atomic(staging_dir + "/trainer_state.json", trainer_state.dump(2) + "\n",
                          "[checkpoint]");
    // Last, over every file above: the parts' as their writers read them back, the rest here.
    const nlohmann::json known = take_part_checksums(staging_dir, parts);
    io::write_checksums(staging_dir, kChecksumsFile, "[checkpoint]", known);
    fsync_directory(staging_dir);
    if (fs::exists(final_dir)) {
      // The same step saved twice by a caller (a resumed run sets a damaged copy aside before it
      // trains, set_aside_damaged_checkpoint): the old copy is moved aside, not deleted, until the
      // new one is in place.
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
  prune_checkpoints(run_dir, final_dir, keep_last);
  return final_dir;
}

void prune_checkpoints(const std::string& run_dir, const std::string& newest, int64_t keep_last) {
  if (keep_last <= 0) return;
  // Each old checkpoint is first renamed to a temporary name (atomic, then fsynced), so a crash
  // part-way through its deletion never leaves an incomplete step_* directory behind;
  // remove_interrupted_saves() finishes the job at the next start.
  // Only checkpoints older than `newest` count: newer ones (left by a run that resumed from an
  // older checkpoint) are kept until this run reaches and replaces them.
  const std::string parent = checkpoints_dir(run_dir);
  const std::string name = fs::path(newest).filename().string();
  std::vector<std::string> older;
  for (const std::string& dir : list_checkpoints(run_dir))
    if (fs::path(dir).filename().string() < name) older.push_back(dir);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < older.size() + 1; ++i) {
    const std::string doomed =
        parent + "/" + kTempPrefix + "pruned-" + fs::path(older[i]).filename().string();
    fs::rename(older[i], doomed, ec);
    if (ec) continue;
    fsync_directory(parent);
    fs::remove_all(doomed, ec);
  }
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointContents& c,
                            int64_t keep_last) {
  const std::string staging = begin_checkpoint(run_dir, step, ::getpid());
  try {
    CheckpointPart part{0, 1, c.params, {}, {}, std::nullopt, {}};
    for (const ParamSpec& spec : c.layout->specs()) {
      part.weights.push_back(&spec);
      if (c.optimizer != nullptr)
        part.state.push_back({&spec, 0, spec.numel, c.optimizer->exp_avg().at(spec),
                              c.optimizer->exp_avg_sq().at(spec)});
    }
    if (c.optimizer != nullptr) part.steps_taken = c.optimizer->steps_taken();
    write_checkpoint_part(staging, part);
  } catch (...) {
    discard_checkpoint(staging);
    throw;
  }
  return commit_checkpoint(run_dir, step, staging, c, 1, keep_last);
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> dirs;
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_ec;  // only real directories: other entries are left alone
    if (entry.is_directory(type_ec) && !entry.is_symlink(type_ec) && name.rfind(kPrefix, 0) == 0)
      dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort chronologically
  return dirs;
}

std::optional<std::string> latest_valid_checkpoint(const std::string& run_dir,
                                                   const ModelConfig& expected,
                                                   const ParamLayout& full,
                                                   std::vector<DamagedCheckpoint>* damaged,
                                                   const VerificationShare& share) {
  std::vector<std::string> dirs = list_checkpoints(run_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    std::string reason;  // this process's verdict on its share; "" when it passed
    try {
      // What the resume will read, checked as it will check it (the structure first, cheap),
      // then every byte against the checksums.
      const RunConfig saved =
          parse_run_config(io::read_text(*it + "/config.toml", "[checkpoint]"),
                           *it + "/config.toml", {}, {}, ScheduleLength::kResumed);
      const TrainerState state = load_trainer_state(*it, saved.train);
      const CheckpointReader reader =
          CheckpointReader::open(*it, expected, full, /*with_optimizer=*/true);
      const bool checked =
          io::verify_checksums(*it, kChecksumsFile, "[checkpoint]", share.index, share.count);
      MOE_CHECK(checked || !state.has_checksums,
                "[checkpoint] {}/{}: missing, but its trainer_state.json says it was written", *it,
                kChecksumsFile);
      // Checksums prove the bytes are those written; a checkpoint written before moecore wrote
      // them (or by another program) may hold a NaN, which a resume would train on silently.
      reader.check_finite(share.index, share.count);
    } catch (const std::exception& e) {
      // Escaped: a reason from the JSON library may echo the damaged file's bytes.
      reason = escape_for_message(e.what());
      if (reason.empty()) reason = "unreadable";
    }
    reason = share.combine(reason);
    if (reason.empty()) return *it;
    // Damaged (edited by hand, a failing disk): fall back to an older one, and say so.
    if (damaged != nullptr) damaged->push_back({*it, reason});
  }
  return std::nullopt;
}

std::string set_aside_damaged_checkpoint(const std::string& dir) {
  const fs::path from(dir);
  const std::string base = (from.parent_path() / ("damaged-" + from.filename().string())).string();
  std::string to = base;
  for (int n = 2; fs::exists(fs::symlink_status(to)); ++n) to = base + "." + std::to_string(n);
  std::error_code ec;
  fs::rename(from, to, ec);
  MOE_CHECK(!ec, "[checkpoint] cannot set the damaged checkpoint {} aside as {}: {}", dir, to,
            ec.message());
  fsync_directory(from.parent_path().string());
  return to;
}

CheckpointReader CheckpointReader::open(const std::string& dir, const ModelConfig& expected,
                                        const ParamLayout& full, bool with_optimizer) {
  const RunConfig saved = parse_run_config(io::read_text(dir + "/config.toml", "[checkpoint]"),
                                           dir + "/config.toml", {}, {}, ScheduleLength::kResumed);
  const std::string difference = model_config_difference(saved.model, expected);
  MOE_CHECK(difference.empty(),
            "[checkpoint] {} was written for another architecture ({} in checkpoint vs config)",
            dir, difference);
  io::TensorParts model = io::TensorParts::open(dir, "model", "[checkpoint]");
  for (const std::string& name : model.names())
    MOE_CHECK(full.find(name) != nullptr,
              "[weights] {}: unexpected tensor '{}' (not a parameter of this model config)",
              model.origin(), name);
  for (const ParamSpec& spec : full.specs()) {
    const std::vector<int64_t>& shape = model.info(spec.name).shape;  // names a missing tensor
    MOE_CHECK(shape == spec.shape, "[safetensors] {}: tensor '{}' has shape {}, expected {}",
              model.file_of(spec.name), spec.name, shape, spec.shape);
  }
  if (!with_optimizer) return CheckpointReader(std::move(model), std::nullopt);

  CheckpointReader reader(std::move(model), io::TensorParts::open(dir, "optim", "[checkpoint]"));
  const io::TensorParts& parts = *reader.optim_;
  // Slices "<moment>.<name>[begin:end]", grouped by "<moment>.<name>".
  std::map<std::string, std::vector<std::string>> slice_names;
  for (const std::string& name : parts.names())
    if (!name.empty() && name.back() == ']' && name.find('[') != std::string::npos)
      slice_names[name.substr(0, name.rfind('['))].push_back(name);
  for (const ParamSpec& spec : full.specs()) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const std::string name = std::string(moment) + "." + spec.name;
      if (parts.has(name)) {  // the whole tensor
        const std::vector<int64_t>& shape = parts.info(name).shape;
        MOE_CHECK(shape == spec.shape, "[safetensors] {}: tensor '{}' has shape {}, expected {}",
                  parts.file_of(name), name, shape, spec.shape);
        continue;
      }
      const auto it = slice_names.find(name);
      MOE_CHECK(it != slice_names.end(), "[checkpoint] {}: missing tensor '{}'", parts.origin(),
                name);
      // "<name>[begin:end]": both bounds checked before they index anything; the slices must
      // tile the tensor exactly, each a 1-D tensor of its length.
      std::vector<Slice> ordered;
      for (const std::string& slice : it->second) {
        const std::string_view bounds =
            std::string_view(slice).substr(name.size() + 1, slice.size() - name.size() - 2);
        const size_t colon = bounds.find(':');
        MOE_CHECK(colon != std::string_view::npos,
                  "[checkpoint] {}: tensor '{}' is not a slice <name>[begin:end]", parts.origin(),
                  slice);
        ordered.push_back({parse_count(bounds.substr(0, colon), spec.numel, parts.origin(), slice),
                           parse_count(bounds.substr(colon + 1), spec.numel, parts.origin(), slice),
                           slice});
      }
      std::sort(ordered.begin(), ordered.end(), [](const Slice& a, const Slice& b) {
        return std::tie(a.begin, a.end, a.tensor) < std::tie(b.begin, b.end, b.tensor);
      });
      size_t covered = 0;
      for (const Slice& slice : ordered) {
        MOE_CHECK(slice.begin == covered && slice.end > slice.begin && slice.end <= spec.numel,
                  "[checkpoint] {}: the slices of '{}' do not tile its {} elements (at {})",
                  parts.origin(), name, spec.numel, slice.tensor);
        const std::vector<int64_t> shape = {static_cast<int64_t>(slice.end - slice.begin)};
        MOE_CHECK(parts.info(slice.tensor).shape == shape,
                  "[safetensors] {}: tensor '{}' has shape {}, expected {}",
                  parts.file_of(slice.tensor), slice.tensor, parts.info(slice.tensor).shape, shape);
        covered = slice.end;
      }
      MOE_CHECK(covered == spec.numel,
                "[checkpoint] {}: the slices of '{}' cover {} of {} elements", parts.origin(), name,
                covered, spec.numel);
      reader.slices_[name] = std::move(ordered);
    }
  }
  const auto it = parts.metadata().find("steps_taken");
  MOE_CHECK(it != parts.metadata().end(), "[checkpoint] {}: no steps_taken in the metadata",
            parts.origin());
  // No run takes 2^40 steps; the trainer also checks it against the trainer state's step.
  reader.steps_taken_ = static_cast<int64_t>(
      parse_count(it->second, uint64_t{1} << 40, parts.origin(), "__metadata__.steps_taken"));
  return reader;
}

void CheckpointReader::read_weights(const ParamLayout& local, ParamBuffers& params) const {
  for (const ParamSpec& spec : local.specs())
    model_.read_f32(spec.name, spec.shape, params.at(spec));
}

void CheckpointReader::check_finite(int64_t share_index, int64_t share_count) const {
  std::vector<float> chunk;
  const auto check = [&](const io::TensorParts& parts) {
    int64_t position = -1;
    for (const std::string& name : parts.names()) {
      if (++position % share_count != share_index) continue;  // another process reads it
      const io::TensorInfo& info = parts.info(name);
      if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16") continue;
      size_t numel = 1;
      for (const int64_t extent : info.shape) numel *= static_cast<size_t>(extent);
      for (size_t first = 0; first < numel; first += size_t{1} << 20) {
        const size_t count = std::min(numel - first, size_t{1} << 20);
        chunk.resize(count);
        parts.read_f32_elements(name, first, count, chunk.data());
        const float* bad = first_non_finite(chunk.data(), chunk.data() + count);
        MOE_CHECK(bad == chunk.data() + count,
                  "[checkpoint] {}: tensor '{}' holds {} at element {}: a resume would train on it",
                  parts.file_of(name), name, *bad, first + static_cast<size_t>(bad - chunk.data()));
      }
    }
  };
  check(model_);
  if (optim_) check(*optim_);
}

void CheckpointReader::read_moment(const std::string& moment, const std::string& name, size_t first,
                                   size_t count, float* dst) const {
  MOE_CHECK(optim_.has_value(), "[checkpoint] {}: opened without its optimizer state",
            model_.origin());
  const std::string tensor = moment + "." + name;
  if (optim_->has(tensor)) {
    optim_->read_f32_elements(tensor, first, count, dst);
    return;
  }
  const auto it = slices_.find(tensor);
  MOE_CHECK(it != slices_.end(), "[checkpoint] {}: missing tensor '{}'", optim_->origin(), tensor);
  // The slices that overlap [first, first + count), each read only where they overlap it.
  const size_t last = first + count;
  for (const Slice& slice : it->second) {
    const size_t begin = std::max(slice.begin, first), end = std::min(slice.end, last);
    if (begin < end)
      optim_->read_f32_elements(slice.tensor, begin - slice.begin, end - begin,
                                dst + (begin - first));
  }
}

void CheckpointReader::read_moments(const std::string& name, size_t first, size_t count,
                                    float* exp_avg, float* exp_avg_sq) const {
  read_moment("exp_avg", name, first, count, exp_avg);
  read_moment("exp_avg_sq", name, first, count, exp_avg_sq);
}

nlohmann::json load_checkpoint(const std::string& dir, const ModelConfig& expected,
                               const ParamLayout& layout, ParamBuffers& params, AdamW* optimizer) {
  const CheckpointReader reader =
      CheckpointReader::open(dir, expected, layout, optimizer != nullptr);
  reader.read_weights(layout, params);
  if (optimizer != nullptr) {
    for (const ParamSpec& spec : layout.specs())
      reader.read_moments(spec.name, 0, spec.numel, optimizer->exp_avg().at(spec),
                          optimizer->exp_avg_sq().at(spec));
    optimizer->set_steps_taken(reader.steps_taken());
  }
  const RunConfig saved = parse_run_config(io::read_text(dir + "/config.toml", "[checkpoint]"),
                                           dir + "/config.toml", {}, {}, ScheduleLength::kResumed);
  load_trainer_state(dir, saved.train);  // every field checked before the run trusts any
  return nlohmann::json::parse(io::read_text(dir + "/trainer_state.json", "[checkpoint]"));
}

void check_checkpoints_dir(const std::string& run_dir) {
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  // Followed through a symbolic link: checkpoints/ linked to a larger disk is a directory.
  const fs::file_status status = fs::status(parent, ec);
  MOE_CHECK(!fs::exists(status) || fs::is_directory(status),
            "[checkpoint] '{}' is not a directory: the run saves its checkpoints there (move it "
            "away, or choose another train.out_dir)",
            parent);
}

void remove_interrupted_saves(const std::string& run_dir) {
  const std::string parent = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_ec;
    if (!entry.is_directory(type_ec) || entry.is_symlink(type_ec)) continue;  // not ours
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
