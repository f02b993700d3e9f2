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

// Makes the routed experts' bf16 GEMMs (and mxfp8's, dequantised to bf16 on any GPU) one launch of
// the kernels that read their row offsets on the device, as a captured step runs them, instead of
// one cuBLASLt GEMM per expert after reading the offsets back (train.cuda_grouped_gemm =
// "one_launch"); fp32's stay per expert. For the whole process.
void set_experts_in_one_launch(bool one_launch);

}  // namespace moecore::kernels::cuda
