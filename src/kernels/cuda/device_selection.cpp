#include "kernels/cuda/device_selection.h"

#include <algorithm>
#include <cstdlib>

#include "core/check.h"
#include "core/device_graph.h"
#include "kernels/cuda/cuda_graphs.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/phase_clock.h"
#include "kernels/cuda/runtime.h"
#include "kernels/device_backends.h"

namespace moecore::kernels::cuda {

namespace {

// This process's rank among those its launcher started on this node (Open MPI, Slurm, torchrun),
// or 0 when no launcher says.
int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* value = std::getenv(var);
    if (value != nullptr && *value != '\0') return std::max(0, std::atoi(value));
  }
  return 0;
}

}  // namespace

std::string activate() {
  const std::string why = unavailable_reason();
  MOE_CHECK(why.empty(), "[cuda] no usable CUDA device ({})", why);
  // One GPU per process on a node: the local rank's, round robin over the visible devices.
  int devices = 0;
  MOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  MOE_CUDA_CHECK(cudaSetDevice(local_rank() % devices));
  keep_freed_device_memory();
  create_backend_state();
  register_device_memory(Device::kCuda, &device_memory());
  register_device_graphs(Device::kCuda, &cuda_graphs());
  register_device_backend(Device::kCuda, &cuda_backend());
  phase_timer::set_device_clock(&cuda_phase_clock());
  return describe(current_device_info());
}

}  // namespace moecore::kernels::cuda
