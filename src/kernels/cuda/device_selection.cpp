#include "kernels/cuda/device_selection.h"

#include "core/check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/device_backends.h"

namespace moecore::kernels::cuda {

std::string activate() {
  const std::string why = unavailable_reason();
  MOE_CHECK(why.empty(), "[cuda] no usable CUDA device ({})", why);
  MOE_CUDA_CHECK(cudaSetDevice(0));
  register_device_memory(Device::kCuda, &device_memory());
  register_device_backend(Device::kCuda, &cuda_backend());
  return describe(current_device_info());
}

}  // namespace moecore::kernels::cuda
