// Checked NCCL and CUDA runtime calls of the NCCL communicator: a failure becomes one line of
// moecore::Error naming the call, the group it was made for, the library's error string (for
// NCCL also ncclGetLastError's detail, which says which argument or peer failed) and the place,
// e.g. "[nccl] ncclAllReduce(...) on group 'dp': invalid argument (<NCCL's detail>) at
// src/dist/nccl/nccl_communicator.cpp:120".
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace moecore::dist::nccl {

[[noreturn]] void fail_nccl_call(ncclResult_t status, ncclComm_t comm, const std::string& group,
                                 const char* call, const char* file, int line);
[[noreturn]] void fail_cuda_call(cudaError_t status, const std::string& group, const char* call,
                                 const char* file, int line);

// comm may be null (no communicator yet, or a call that belongs to none): ncclGetLastError then
// reports the last error of this thread's calls.
inline void check(ncclResult_t status, ncclComm_t comm, const std::string& group, const char* call,
                  const char* file, int line) {
  if (status != ncclSuccess) fail_nccl_call(status, comm, group, call, file, line);
}
// A failed CUDA call's error is cleared from the runtime's last error, as the CUDA backend's
// checks do (kernels/cuda/runtime.h): the backend's next launch check would report it again.
inline void check(cudaError_t status, ncclComm_t /*comm*/, const std::string& group,
                  const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail_cuda_call(status, group, call, file, line);
  }
}

// Whether `stream` is being captured into a CUDA graph (a failed query throws, naming the group).
bool stream_capturing(cudaStream_t stream, ncclComm_t comm, const std::string& group);

}  // namespace moecore::dist::nccl

// MOE_NCCL_CHECK(ncclAllReduce(...), comm_, name()): throws moecore::Error when the call (an NCCL
// or a CUDA runtime call) fails.
#define MOE_NCCL_CHECK(call, comm, group) \
  ::moecore::dist::nccl::check((call), (comm), (group), #call, __FILE__, __LINE__)
