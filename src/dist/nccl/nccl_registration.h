// NCCL's communicator (nccl_communicator.h) as the communicator over CUDA memory
// (dist/device_communicators.h), for the code that composes a program: it registers it once the
// process has selected its GPU (kernels/cuda/device_selection.h activate()), and the trainer
// builds its groups from it (parallel.communicator). No CUDA or NCCL header here, so the
// composition (src/cli/, the CUDA tests) may include it; only a program linked with
// moecore_dist_nccl can call it.
#pragma once

#include <string>

namespace moecore::dist::nccl {

// The NCCL library this process loaded (ncclGetVersion) and the headers it was built against,
// for a start-up line: "NCCL 2.28.9 loaded, built against 2.28.9". They differ where the loader
// found another libnccl.so.2 (a wheel's, the toolkit's), and then parallel.rowwise_transport=
// "symmetric" refuses to run (its kernel inlines the headers' device API), as its tests skip:
// the line says so.
std::string describe_library();

// Registers the factory "nccl" for Device::kCuda: NcclCommunicator::create over the bootstrap
// group, on the device and stream of the CUDA backend.
void register_communicator();

}  // namespace moecore::dist::nccl
