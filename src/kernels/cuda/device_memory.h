// The GPU's memory as core/device_memory.h's DeviceMemory: stream-ordered allocations
// (cudaMallocAsync on the backend's stream, so that freeing a buffer the stream still uses is
// safe), copies that return once done, zeroing in stream order. activate() registers it.
#pragma once

#include "core/device_memory.h"

namespace moecore::kernels::cuda {

DeviceMemory& device_memory();

}  // namespace moecore::kernels::cuda
