#include "cli/devices_command.h"

#include <fmt/format.h>
#include <omp.h>

#include <fstream>
#include <string>

#include "core/check.h"
#include "kernels/gemm.h"
#if MOECORE_CLI_HAS_CUDA
#include "kernels/cuda/device_selection.h"
#endif
#if MOECORE_CLI_HAS_NCCL
#include "dist/nccl/nccl_registration.h"
#endif

namespace moecore::cli {

namespace {

// The processor's name as the kernel reports it ("model name" in /proc/cpuinfo), or "unknown".
std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) break;
    return line.substr(colon + 2);
  }
  return "unknown";
}

std::string cuda_line() {
#if MOECORE_CLI_HAS_CUDA
  const std::string why = kernels::cuda::unavailable_reason();
  if (!why.empty()) return fmt::format("unavailable ({})", why);
  return kernels::cuda::activate();
#else
  // A build with the CUDA toolkit builds the backend and its tests, but links it into this
  // program only when asked (cuBLAS's libraries would add a tenth of a second to every start).
  return "not in this program (build it with the CUDA toolkit and `cmake --preset cuda`)";
#endif
}

}  // namespace

void run_devices() {
  const bool native_bf16 = kernels::bf16_gemm_path() == kernels::Bf16GemmPath::kNative;
  fmt::print(
      "cpu: {}, {} threads, bf16 GEMMs {}\n", cpu_model_name(), omp_get_max_threads(),
      native_bf16 ? "native (oneDNN, AVX512-BF16)" : "emulated (fp32 on bf16-rounded inputs)");
  fmt::print("cuda: {}\n", cuda_line());
}

std::string select_device(const TrainConfig& train) {
  if (train.device == Device::kCpu) return "";
#if MOECORE_CLI_HAS_CUDA
  std::string description = kernels::cuda::activate();
  kernels::cuda::set_experts_in_one_launch(train.cuda_grouped_gemm == CudaGroupedGemm::kOneLaunch);
#if MOECORE_CLI_HAS_NCCL
  // The job's groups over the GPU's memory (parallel.communicator, train/communicator_choice.h).
  dist::nccl::register_communicator();
#endif
  return description;
#else
  throw Error(fmt::format(
      "[device] train.device={}: this moecore program has no CUDA backend (build it with the "
      "CUDA toolkit and `cmake --preset cuda`)",
      device_name(train.device)));
#endif
}

}  // namespace moecore::cli
