// The search behind index_checks.h: every index out of range takes part in an integer atomicMin,
// so the first one wins whatever order the threads run in.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void set_kernel(int64_t* first_bad, int64_t value) {
  *first_bad = value;
}

__global__ void find_first_index_outside_kernel(const int32_t* indices, int64_t count,
                                                int64_t limit, int64_t* first_bad) {
  for (int64_t i = grid_first(); i < count; i += grid_stride()) {
    if (indices[i] < 0 || indices[i] >= limit) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_bad),
                static_cast<unsigned long long>(i));
    }
  }
}

}  // namespace

void launch_find_first_index_outside(const int32_t* indices, int64_t count, int64_t limit,
                                     int64_t* first_bad, cudaStream_t stream) {
  set_kernel<<<1, 1, 0, stream>>>(first_bad, count);
  if (count > 0)
    find_first_index_outside_kernel<<<elementwise_blocks(count), kElementThreads, 0, stream>>>(
        indices, count, limit, first_bad);
}

}  // namespace moecore::kernels::cuda
