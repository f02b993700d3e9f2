// NCCL's communicator (nccl_communicator.h) as the communicator over CUDA memory
// (dist/device_communicators.h), for the code that composes a program: it registers it once the
// process has selected its GPU (kernels/cuda/device_selection.h activate()), and the trainer
// builds its groups from it (parallel.communicator). No CUDA or NCCL header here, so the
// composition (src/cli/, the CUDA tests) may include it; only a program linked with
// moecore_dist_nccl can call it.
#pragma once

namespace moecore::dist::nccl {

// Registers the factory "nccl" for Device::kCuda: NcclCommunicator::create over the bootstrap
// group, on the device and stream of the CUDA backend.
void register_communicator();

}  // namespace moecore::dist::nccl
