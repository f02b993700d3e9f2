#include "dist/nccl/nccl_check.h"

#include <cstring>

#include "core/check.h"

namespace moecore::dist::nccl {

void fail_nccl_call(ncclResult_t status, ncclComm_t comm, const std::string& group,
                    const char* call, const char* file, int line) {
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && std::strlen(detail) > 0)
    fail("[nccl] {} on group '{}': {} ({}) at {}:{}", call, group, ncclGetErrorString(status),
         detail, file, line);
  fail("[nccl] {} on group '{}': {} at {}:{}", call, group, ncclGetErrorString(status), file, line);
}

void fail_cuda_call(cudaError_t status, const std::string& group, const char* call,
                    const char* file, int line) {
  fail("[nccl] {} on group '{}': {} at {}:{}", call, group, cudaGetErrorString(status), file, line);
}

bool stream_capturing(cudaStream_t stream, ncclComm_t comm, const std::string& group) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOE_NCCL_CHECK(cudaStreamIsCapturing(stream, &status), comm, group);
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace moecore::dist::nccl
