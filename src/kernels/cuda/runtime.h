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
// fail_cuda_call for a CUDA runtime status. A fault of the device's work (an illegal address, a
// misaligned access, a launch failure...) is reported by whichever call waits next, not by the
// operation whose kernel faulted: unless sync_each_op() (below), the message says so and names
// the switch that finds that operation.
[[noreturn]] void fail_cuda_status(cudaError_t status, const char* call, const char* file,
                                   int line);

// A failed call's error is reported by the throw and cleared from the runtime's last error, so
// that the next launch's cudaGetLastError check does not report it again (a sticky error, which
// spoils the context, stays).
inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail_cuda_status(status, call, file, line);
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

// Whether every operation waits for the work it issued: MOECORE_CUDA_SYNC_EACH_OP=1 in the
// environment (read at the first call; set_sync_each_op changes it for the process). A kernel's
// fault (an illegal address, a misaligned access) is asynchronous and sticky: without the switch
// it surfaces at the next wait for the stream, in whatever call waits, naming none, and every
// later call fails with it. With it, each operation waits after its launches, outside a CUDA
// graph's capture (where a wait would break the capture; a graph's replay waits instead), so
// the operation whose work faulted reports it: "[cuda] an illegal memory access was
// encountered in rmsnorm_backward (launch_rmsnorm_backward) at src/kernels/cuda/rmsnorm.cpp:48,
// found by MOECORE_CUDA_SYNC_EACH_OP's wait after it". A wait per operation is slow: a switch
// for diagnosis (scripts/gpu_check.sh reruns a test that faulted with it), not for training.
bool sync_each_op();
void set_sync_each_op(bool enabled);

// After an operation's launches (op: its name, as its checks give it; launcher: what issued the
// work, a launcher of launchers.h or a cuBLAS call): throws the launch's error, and with
// sync_each_op() outside a capture first waits for the stream and throws a fault of that work,
// naming both (the message above). Index errors (index_checks.h) stay for synchronize().
void check_launch(const char* op, const char* launcher, const char* file, int line);

}  // namespace moecore::kernels::cuda

// MOE_CUDA_CHECK_LAUNCH(kOp, "launch_rmsnorm_forward") after the launcher's call: check_launch.
#define MOE_CUDA_CHECK_LAUNCH(op, launcher) \
  ::moecore::kernels::cuda::check_launch((op), (launcher), __FILE__, __LINE__)

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
