// The GPU's memory as core/device_memory.h's DeviceMemory: stream-ordered allocations
// (cudaMallocAsync on the backend's stream, so that freeing a buffer the stream still uses is
// safe), copies that return once done, zeroing in stream order. activate() registers it.
#pragma once

#include <cstdint>

#include "core/device_memory.h"

namespace moecore::kernels::cuda {

DeviceMemory& device_memory();

// Frees the device allocations that were freed inside a CUDA graph's capture, kept until it
// ended, and returns how many there were since the last call. Inside a capture cudaFreeAsync
// becomes a node of the graph and takes only the graph's own allocations (an error for any other);
// such a free would also be repeated at every replay: CudaGraphs::end_capture fails on one. Call
// it once the capture has ended.
int64_t release_frees_inside_capture();

}  // namespace moecore::kernels::cuda
