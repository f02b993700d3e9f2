#include "kernels/cuda/expert_offsets_on_host.h"

#include "core/device_memory.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

std::vector<int64_t> expert_offsets_on_host(const char* op, ConstTensorView expert_offsets,
                                            const GroupedGemmDims& dims) {
  MOE_CHECK(!capturing(),
            "[{}] reads the experts' offsets on the host, which a stream being captured into a "
            "CUDA graph cannot do (there the bf16 and MX grouped GEMMs read them on the device)",
            op);
  std::vector<int64_t> offsets(static_cast<size_t>(dims.experts + 1));
  note_host_read(op);
  MOE_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), expert_offsets.data<int64_t>(op),
                                 offsets.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 stream()));
  synchronize();
  check_expert_offsets(op, offsets, dims);
  return offsets;
}

}  // namespace moecore::kernels::cuda
