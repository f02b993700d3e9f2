#include "kernels/cuda/index_checks.h"

#include "kernels/cuda/launchers.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"

namespace moecore::kernels::cuda {

std::optional<BadIndex> first_index_outside(const int32_t* indices, int64_t count, int64_t limit) {
  if (count == 0) return std::nullopt;
  const StreamScratch first_bad(sizeof(int64_t), stream());
  launch_find_first_index_outside(indices, count, limit, first_bad.as<int64_t>(), stream());
  MOE_CUDA_CHECK(cudaGetLastError());
  int64_t position = count;
  MOE_CUDA_CHECK(cudaMemcpyAsync(&position, first_bad.as<int64_t>(), sizeof(position),
                                 cudaMemcpyDeviceToHost, stream()));
  synchronize();
  if (position >= count) return std::nullopt;
  int32_t value = 0;
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(&value, indices + position, sizeof(value), cudaMemcpyDeviceToHost, stream()));
  synchronize();
  return BadIndex{position, value};
}

}  // namespace moecore::kernels::cuda
