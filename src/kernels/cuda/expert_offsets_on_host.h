// The grouped GEMMs' expert offsets brought to the host: the per-expert cuBLASLt GEMMs
// (grouped_gemm.cpp, mx_gemm.cpp) need each expert's row count there, while the routing writes
// the offsets in device memory. The copy waits for the stream (the routing before it): the one
// wait left between the router and the experts on this backend, noted for core/device_memory.h's
// HostReadLog. The device-offset kernels (grouped_gemm_device.h) have none; in a stream being
// captured into a CUDA graph the copy is refused in one line.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor_view.h"
#include "kernels/grouped_gemm_checks.h"

namespace moecore::kernels::cuda {

// expert_offsets [E + 1] i64 in device memory, copied and checked as the CPU backend checks them.
std::vector<int64_t> expert_offsets_on_host(const char* op, ConstTensorView expert_offsets,
                                            const GroupedGemmDims& dims);

}  // namespace moecore::kernels::cuda
