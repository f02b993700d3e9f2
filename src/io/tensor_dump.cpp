#include "io/tensor_dump.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/check.h"
#include "io/file_util.h"
#include "io/safetensors.h"

namespace moecore::io {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "moecore-tensor-dump";
constexpr int kVersion = 1;
constexpr const char* kTensorsFile = "tensors.safetensors";
constexpr const char* kManifestFile = "manifest.json";

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t extent : shape) n *= extent;
  return n;
}

}  // namespace

std::string check_new_dump_dir(const std::string& dir_arg) {
  // "out/" names the directory "out": its staging sibling must not land inside it.
  fs::path dir_path = fs::path(dir_arg).lexically_normal();
  if (!dir_path.has_filename()) dir_path = dir_path.parent_path();
  const std::string dir = dir_path.string();
  MOE_CHECK(!dir.empty() && dir != "." && dir != "..",
            "[dump] the output directory '{}' does not name a new directory", dir_arg);
  MOE_CHECK(!fs::exists(dir) || (fs::is_directory(dir) && fs::is_empty(dir)),
            "[dump] {} already exists and is not an empty directory", dir);
  return dir;
}

void write_tensor_dump(const TensorDump& dump, const std::string& dir_arg) {
  const std::string dir = check_new_dump_dir(dir_arg);
  SafetensorsWriter writer;
  nlohmann::json listed = nlohmann::json::array();
  for (const DumpedTensor& t : dump.tensors) {
    MOE_CHECK(numel_of(t.shape) == static_cast<int64_t>(t.values.size()),
              "[dump] tensor {} has {} values for shape {}", t.name, t.values.size(), t.shape);
    writer.add_f32(t.name, t.shape, t.values.data());
    listed.push_back({{"name", t.name},
                      {"phase", t.phase},
                      {"kind", t.index ? "index" : "value"},
                      {"shape", t.shape}});
  }
  // An absent `dir` is written as a sibling and renamed into place, as checkpoints and imports
  // are; an existing empty one (a link, a mount point, a directory made for the run) is written
  // into. Either way a write that fails (a full disk) leaves nothing that a rerun or `diff` would
  // take for a dump: the staging directory, or the files written into `dir`, are removed.
  const bool into_existing = fs::exists(dir);
  const std::string target = into_existing ? dir : dir + ".dump-" + std::to_string(::getpid());
  std::error_code error;
  if (!into_existing) {
    fs::remove_all(target, error);
    fs::create_directories(target, error);
    MOE_CHECK(!error, "[dump] cannot create {}: {}", target, error.message());
  }
  const std::string tensors_path = (fs::path(target) / kTensorsFile).string();
  const std::string manifest_path = (fs::path(target) / kManifestFile).string();
  try {
    writer.write(tensors_path);
    const nlohmann::json manifest = {
        {"format", kFormat}, {"version", kVersion}, {"run", dump.run}, {"tensors", listed}};
    write_text_atomic(manifest_path, manifest.dump(1) + "\n", "[dump]");
    if (!into_existing) {
      fs::rename(target, dir, error);
      MOE_CHECK(!error, "[dump] cannot move {} to {}: {}", target, dir, error.message());
    }
  } catch (...) {
    if (into_existing) {
      fs::remove(manifest_path, error);
      fs::remove(tensors_path, error);
    } else {
      fs::remove_all(target, error);
    }
    throw;
  }
}

TensorDump read_tensor_dump(const std::string& dir) {
  MOE_CHECK(fs::is_directory(dir), "[diff] {} is not a directory (expected a moecore dump)", dir);
  const std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  MOE_CHECK(fs::exists(manifest_path), "[diff] {} has no {} (not a complete moecore dump)", dir,
            kManifestFile);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_text(manifest_path, "[diff]"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("[diff] {}: not valid JSON ({})", manifest_path, e.what()));
  }
  TensorDump dump;
  std::set<std::string> listed;
  const SafetensorsReader reader = SafetensorsReader::open((fs::path(dir) / kTensorsFile).string());
  try {
    MOE_CHECK(manifest.is_object() && manifest.value("format", "") == kFormat,
              "[diff] {}: \"format\" is not \"{}\"", manifest_path, kFormat);
    MOE_CHECK(manifest.value("version", 0) == kVersion,
              "[diff] {}: version {} is not the supported {}", manifest_path,
              manifest.contains("version") ? manifest["version"].dump() : "(none)", kVersion);
    MOE_CHECK(manifest.contains("tensors") && manifest["tensors"].is_array(),
              "[diff] {}: no \"tensors\" list", manifest_path);

    if (manifest.contains("run") && manifest["run"].is_object()) dump.run = manifest["run"];
    for (const nlohmann::json& entry : manifest["tensors"]) {
      MOE_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                    entry.contains("shape") && entry["shape"].is_array(),
                "[diff] {}: a tensors entry lacks a name or a shape", manifest_path);
      DumpedTensor t;
      t.name = entry["name"].get<std::string>();
      t.phase = entry.value("phase", "");
      MOE_CHECK(t.phase == "forward" || t.phase == "backward",
                "[diff] {}: tensor {} has phase '{}' (expected forward or backward)", manifest_path,
                t.name, t.phase);
      const std::string kind = entry.value("kind", "value");
      MOE_CHECK(kind == "value" || kind == "index",
                "[diff] {}: tensor {} has kind '{}' (expected value or index)", manifest_path,
                t.name, kind);
      t.index = kind == "index";
      for (const nlohmann::json& extent : entry["shape"]) {
        MOE_CHECK(extent.is_number_integer() && extent.get<int64_t>() >= 0,
                  "[diff] {}: tensor {} has a bad shape {}", manifest_path, t.name,
                  entry["shape"].dump());
        t.shape.push_back(extent.get<int64_t>());
      }
      MOE_CHECK(listed.insert(t.name).second, "[diff] {}: tensor {} is listed twice", manifest_path,
                t.name);
      MOE_CHECK(reader.has(t.name), "[diff] {}: tensor {} is listed but not in {}", dir, t.name,
                kTensorsFile);
      MOE_CHECK(reader.info(t.name).shape == t.shape,
                "[diff] {}: tensor {} is {} in {} but {} in the manifest", dir, t.name,
                reader.info(t.name).shape, kTensorsFile, t.shape);
      t.values = reader.read_f32(t.name);
      dump.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("[diff] {}: malformed manifest ({})", manifest_path, e.what()));
  }
  for (const std::string& name : reader.names())
    MOE_CHECK(listed.contains(name), "[diff] {}: tensor {} is in {} but not in the manifest", dir,
              name, kTensorsFile);
  return dump;
}

}  // namespace moecore::io
