// The search behind index_checks.h: every index out of range takes part in an integer atomicMin,
// so the first one wins whatever order the threads run in; then one thread records it for the
// host unless an earlier operation's error is still pending.
#include "kernels/cuda/launch_shape.cuh"
#include "kernels/cuda/launchers.h"

namespace moecore::kernels::cuda {
namespace {

__global__ void set_kernel(int64_t* first_bad, int64_t value) {
  *first_bad = value;
}

__global__ void find_first_index_outside_kernel(const int32_t* indices, int64_t count,
                                                int64_t lowest, int64_t limit, int64_t* first_bad) {
  for (int64_t i = grid_first(); i < count; i += grid_stride()) {
    if (indices[i] < lowest || indices[i] >= limit) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_bad),
                static_cast<unsigned long long>(i));
    }
  }
}

// One thread. The record is host memory the device writes (mapped): its fields first, then op,
// which the host reads to know that one is there, after a fence that makes the fields visible
// to the host first.
__global__ void record_kernel(const int32_t* indices, int64_t count, int64_t lowest, int64_t limit,
                              const int64_t* first_bad, volatile IndexErrorRecord* record,
                              unsigned long long op, unsigned long long name) {
  const int64_t position = *first_bad;
  if (position >= count || record->op != 0) return;
  record->name = name;
  record->position = position;
  record->lowest = lowest;
  record->limit = limit;
  record->value = indices[position];
  __threadfence_system();
  record->op = op;
}

}  // namespace

void launch_record_first_index_outside(const int32_t* indices, int64_t count, int64_t lowest,
                                       int64_t limit, int64_t* first_bad, IndexErrorRecord* record,
                                       unsigned long long op, unsigned long long name,
                                       cudaStream_t stream) {
  if (count <= 0) return;
  set_kernel<<<1, 1, 0, stream>>>(first_bad, count);
  find_first_index_outside_kernel<<<elementwise_blocks(count), kElementThreads, 0, stream>>>(
      indices, count, lowest, limit, first_bad);
  record_kernel<<<1, 1, 0, stream>>>(indices, count, lowest, limit, first_bad, record, op, name);
}

}  // namespace moecore::kernels::cuda
