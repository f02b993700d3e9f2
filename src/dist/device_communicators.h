// Communicators over a device's memory, for the code that composes a program: a transport of
// src/dist/ whose operations take buffers in a device's memory as they are (NCCL for CUDA,
// src/dist/nccl/) registers its factory here for that device when the program selects the device
// (the moecore command's select_device, the CUDA tests), as the kernels' backends register in
// kernels/device_backends.h; the trainer looks it up (parallel.communicator) without linking it.
// No transport's header here, so any layer above dist may include it.
#pragma once

#include <memory>
#include <string>

#include "core/device.h"
#include "dist/communicator.h"

namespace moecore::dist {

struct DeviceCommunicatorFactory {
  // The transport's name, as parallel.communicator and the start-up line say it ("nccl").
  const char* name;
  // Collective over `bootstrap` (the MPI world or any group of it): a group of the same ranks in
  // the same order whose operations take the device's memory (reaches_device_memory()), on the
  // device this process selected. `group` names it in errors and the traffic counters.
  std::unique_ptr<Communicator> (*create)(const Communicator& bootstrap, const std::string& group);
  // Collective over `bootstrap`: why `create` cannot serve its ranks ("ranks 0 and 1 share one
  // GPU, and NCCL takes one rank per device"), or "" when it can. Null: it always can.
  std::string (*unusable)(const Communicator& bootstrap) = nullptr;
};

// Makes `factory` the communicator over `device`'s memory (not Device::kCpu: host memory is MPI's);
// nullptr: none. Registering again replaces it. `factory` must outlive its registration.
void register_device_communicator(Device device, const DeviceCommunicatorFactory* factory);
// The factory registered for `device`, or nullptr (always for Device::kCpu).
const DeviceCommunicatorFactory* device_communicator(Device device);

}  // namespace moecore::dist
