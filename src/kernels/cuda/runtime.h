// The CUDA runtime as the CUDA backend uses it: checked calls that name the call, file and line;
// the device this process runs on; the backend's stream, cuBLASLt handle and GEMM workspace.
// Host code (*.cpp, the host compiler) uses this header; the kernels' launchers (launchers.h)
// take raw device pointers and the stream.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kernels/cuda/device_selection.h"

namespace moecore::kernels::cuda {

[[noreturn]] void fail_cuda_call(const char* status, const char* call, const char* file, int line);

// A failed call's error is reported by the throw and cleared from the runtime's last error, so
// that the next launch's cudaGetLastError check does not report it again (a sticky error, which
// spoils the context, stays).
inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail_cuda_call(cudaGetErrorString(status), call, file, line);
  }
}
inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail_cuda_call(cublasLtGetStatusString(status), call, file, line);
}

}  // namespace moecore::kernels::cuda

// MOE_CUDA_CHECK(cudaMemcpyAsync(...)): throws moecore::Error "[cuda] <status> in <call> at
// <file>:<line>" when the call fails. MOE_CUBLAS_CHECK likewise for cuBLAS / cuBLASLt.
#define MOE_CUDA_CHECK(call) ::moecore::kernels::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MOE_CUBLAS_CHECK(call) \
  ::moecore::kernels::cuda::check_cublas((call), #call, __FILE__, __LINE__)

namespace moecore::kernels::cuda {

struct DeviceInfo {
  std::string name;  // as the driver reports it, e.g. "NVIDIA H200"
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
};

// The device the backend runs on (the one activate() selected); the CUDA build's start-up line
// names it with describe(), and which path its MX GEMMs take (mx_gemm.cpp).
DeviceInfo current_device_info();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB; MX GEMMs through bf16: no MX tensor cores)"
std::string describe(const DeviceInfo& device);
// Whether the device has MX tensor cores (compute capability 10 and later: mx_gemm.cpp).
bool has_mx_tensor_cores(const DeviceInfo& device);

// The stream every operation of this backend is issued on, created on first use. Operations are
// asynchronous with respect to the host unless their declaration says otherwise.
cudaStream_t stream();
// Whether stream() is being captured into a CUDA graph (cudaStreamBeginCapture): operations then
// issue work without waiting for it, or refuse in one line where they would have to.
bool capturing();
// Whether the routed experts' grouped GEMMs run as one launch of the kernels that read the row
// offsets on the device (grouped_gemm_device.h) instead of one cuBLASLt GEMM per expert with the
// offsets read back: in a capture (which a host read would break), and everywhere once the program
// asked for it (device_selection.h's run_experts_in_one_launch).
bool experts_in_one_launch();
// Waits for everything issued on stream(); throws on an error any of it raised, an index
// outside its tensor included (index_checks.h).
void synchronize();

// Makes the current device's stream-ordered pool keep what is freed (as PyTorch's caching
// allocator does): with the default release threshold of 0 it would hand the memory back to the
// driver at every synchronisation and map it again at the next allocations. activate() calls it.
void keep_freed_device_memory();

// cuBLAS's handle, on stream(), for the GEMMs cuBLASLt has no kernel for (gemm_lt.cpp).
cublasHandle_t cublas_handle();

// cuBLASLt's handle and its workspace (kGemmWorkspaceBytes, allocated once per process).
cublasLtHandle_t cublaslt_handle();
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
void* gemm_workspace();

// Creates now what the backend otherwise creates on first use (the stream, cuBLAS's and
// cuBLASLt's handles, the GEMM workspace, the index checks' record): allocations and library
// set-up are refused in a stream being captured into a CUDA graph, which must never be the first
// to need them. activate() calls it.
void create_backend_state();

}  // namespace moecore::kernels::cuda
