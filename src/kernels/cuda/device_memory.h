// The GPU's memory as core/device_memory.h's DeviceMemory: stream-ordered allocations
// (cudaMallocAsync on the backend's stream, so that freeing a buffer the stream still uses is
// safe), copies that return once done, zeroing in stream order. activate() registers it.
#pragma once

#include <cstdint>

#include "core/device_memory.h"

namespace moecore::kernels::cuda {

DeviceMemory& device_memory();

// How many device allocations were freed inside a CUDA graph's capture since the last call (such
// a free would be repeated at every replay: CudaGraphs::end_capture fails on one).
int64_t take_frees_inside_capture();

}  // namespace moecore::kernels::cuda
