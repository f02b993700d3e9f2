#include "plan/hardware.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"

namespace moecore::plan {

namespace {

constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
// Peak RSS of a moecore training process whose tensors are negligible (a d 16, 1-layer model):
// 19 MiB alone, 25-26 MiB per rank under mpirun (binary, oneDNN, OpenMP, Open MPI, allocator
// arenas), measured with `moecore train` on the development machine; the MPI figure, less the
// model's own ~2 MiB.
constexpr double kCpuRuntimeMiB = 24.0;
constexpr double kGpuRuntimeGiB = 1.0;  // assumed: CUDA context, cuBLAS/NCCL workspaces

}  // namespace

Hardware load_hardware(const std::string& spec) {
  std::string lower = spec;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lower == "cpu") {
    const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
    const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE));
    return {"cpu", pages * page, kCpuRuntimeMiB * kMiB,
            "this machine's physical memory; baseline measured on moecore train", false};
  }
  const auto gpu = [](const char* name, double gb) {
    return Hardware{name, gb * 1e9, kGpuRuntimeGiB * kGiB,
                    "NVIDIA data sheet memory; 1 GiB CUDA context and workspaces assumed", true};
  };
  if (lower == "h100") return gpu("h100", 80.0);
  if (lower == "h200") return gpu("h200", 141.0);
  if (lower == "b200") return gpu("b200", 180.0);
  MOE_CHECK(std::filesystem::is_regular_file(spec),
            "[plan] --hardware {}: not a built-in profile (cpu, h100, h200, b200) nor a file",
            spec);
  std::ifstream in(spec);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "[plan] --hardware {}: not valid JSON ({})", spec, e.what());
  }
  MOE_CHECK(j.is_object() && j.contains("memory_gib") && j["memory_gib"].is_number() &&
                j["memory_gib"].get<double>() > 0.0,
            "[plan] --hardware {}: needs a positive number \"memory_gib\"", spec);
  Hardware h;
  h.name = j.value("name", std::filesystem::path(spec).stem().string());
  h.memory_bytes = j["memory_gib"].get<double>() * kGiB;
  const double overhead = j.value("runtime_overhead_mib", 0.0);
  MOE_CHECK(overhead >= 0.0, "[plan] --hardware {}: runtime_overhead_mib={} must be >= 0", spec,
            overhead);
  h.runtime_bytes = overhead * kMiB;
  h.device = j.value("device", false);
  h.source = spec;
  return h;
}

}  // namespace moecore::plan
