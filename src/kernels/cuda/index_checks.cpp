#include "kernels/cuda/index_checks.h"

#include "core/check.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"

namespace moecore::kernels::cuda {

namespace {

// The one record of the process: pinned host memory mapped into the device's address space,
// written by the record kernel, read by the host after a wait. Never freed (as the stream is not).
IndexErrorRecord* pending_record() {
  static IndexErrorRecord* const record = [] {
    void* host = nullptr;
    MOE_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexErrorRecord),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
    auto* r = static_cast<IndexErrorRecord*>(host);
    *r = IndexErrorRecord{};
    return r;
  }();
  return record;
}

IndexErrorRecord* pending_record_on_device() {
  static IndexErrorRecord* const device = [] {
    void* pointer = nullptr;
    MOE_CUDA_CHECK(cudaHostGetDevicePointer(&pointer, pending_record(), 0));
    return static_cast<IndexErrorRecord*>(pointer);
  }();
  return device;
}

}  // namespace

void check_indices_inside(const char* op, const char* name, const int32_t* indices, int64_t count,
                          int64_t limit, int32_t lowest) {
  if (count <= 0) return;
  const StreamScratch first_bad(sizeof(int64_t), stream());
  launch_record_first_index_outside(indices, count, lowest, limit, first_bad.as<int64_t>(),
                                    pending_record_on_device(),
                                    reinterpret_cast<unsigned long long>(op),
                                    reinterpret_cast<unsigned long long>(name), stream());
  MOE_CUDA_CHECK_LAUNCH(op, "launch_record_first_index_outside");
}

void prepare_index_checks() {
  pending_record_on_device();  // and pending_record()
}

void throw_pending_index_error() {
  volatile IndexErrorRecord* record = pending_record();
  if (record->op == 0) return;
  const auto* op = reinterpret_cast<const char*>(record->op);
  const auto* name = reinterpret_cast<const char*>(record->name);
  const long long position = record->position, lowest = record->lowest, limit = record->limit;
  const int value = record->value;
  record->op = 0;  // cleared before the throw: the next check may record again
  fail(
      "[{}] {}[{}]={} is outside [{}, {}) (found on the device; reported at the next "
      "synchronisation)",
      op, name, position, value, lowest, limit);
}

}  // namespace moecore::kernels::cuda
