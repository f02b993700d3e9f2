// The CUDA backend's DeviceGraphs (core/device_graph.h): a capture of the backend's stream in
// global mode (a wait for the stream or a synchronous copy anywhere in the process breaks it),
// instantiated into an executable graph, which a replay launches on the stream without waiting.
// activate() registers it.
#pragma once

#include "core/device_graph.h"

namespace moecore::kernels::cuda {

DeviceGraphs& cuda_graphs();

}  // namespace moecore::kernels::cuda
