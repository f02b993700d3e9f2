// Selecting the GPU, for the code that composes a program (the moecore command, the CUDA tests):
// no CUDA header here, so code outside the backend may include it.
#pragma once

#include <string>

namespace moecore::kernels::cuda {

// Why this process cannot use a CUDA device, in the runtime's words (no driver, a driver older
// than the runtime, no device), or "" when it can.
std::string unavailable_reason();

// Makes this process allocate Device::kCuda memory (core/device_memory.h) and run its operations
// on views in that memory on the CUDA backend (kernels/device_backends.h), once a device is known
// to be usable: the device of this process's rank on its node (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID or LOCAL_RANK; 0 without a launcher) modulo the visible devices. Otherwise throws
// moecore::Error "[cuda] no usable CUDA device (<why>)". train.profile's phases are then timed on
// the device (kernels/cuda/phase_clock.h). Returns the device's description for a start-up line:
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)".
std::string activate();

}  // namespace moecore::kernels::cuda
