// Which backend runs an operation: the one of the memory its views are in. kernels/ops.h's
// operations (kernels/device_dispatch.cpp) look at the devices of the views they are handed: views
// in host memory go to the CPU backend (kernels::cpu), which is always there; views in a device's
// memory to the table registered for that device here, by the backend itself when the process
// selects it (kernels/cuda/device_selection.h for a GPU). One operation's views are all in one
// device's memory (empty views count for none); anything else is an error naming the operation.
#pragma once

#include <string_view>

#include "core/tensor_view.h"
#include "kernels/backend.h"

namespace moecore::kernels {

// Makes `backend` run the operations on views in `device`'s memory (not Device::kCpu: that is the
// CPU backend's); nullptr: none does. Register before the first operation on such views;
// registering again replaces the table (operations in flight on other threads must not race with
// it).
void register_device_backend(Device device, const KernelBackend* backend);
// The table registered for `device`, or nullptr (for Device::kCpu: cpu_backend()).
const KernelBackend* device_backend(Device device);

}  // namespace moecore::kernels
