#include "kernels/cuda/runtime.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/check.h"
#include "kernels/cuda/device_selection.h"
#include "kernels/cuda/index_checks.h"

namespace moecore::kernels::cuda {

void fail_cuda_call(const char* status, const char* call, const char* file, int line) {
  fail("[cuda] {} in {} at {}:{}", status, call, file, line);
}

namespace {

// The statuses of a fault of the device's work: sticky, and reported by a later call than the
// launch whose kernel faulted.
bool is_device_fault(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
      return true;
    default:
      return false;
  }
}

std::atomic<bool>& sync_each_op_flag() {
  static std::atomic<bool> enabled = [] {
    const char* value = std::getenv("MOECORE_CUDA_SYNC_EACH_OP");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return enabled;
}

}  // namespace

void fail_cuda_status(cudaError_t status, const char* call, const char* file, int line) {
  if (!is_device_fault(status) || sync_each_op())
    fail_cuda_call(cudaGetErrorString(status), call, file, line);
  fail(
      "[cuda] {} in {} at {}:{}: a fault of device work issued before this call, which does not "
      "name it (MOECORE_CUDA_SYNC_EACH_OP=1 makes every operation wait for its own work and name "
      "itself)",
      cudaGetErrorString(status), call, file, line);
}

bool sync_each_op() {
  return sync_each_op_flag();
}

void set_sync_each_op(bool enabled) {
  sync_each_op_flag() = enabled;
}

void check_launch(const char* op, const char* launcher, const char* file, int line) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    fail_cuda_status(status, fmt::format("{} ({})", op, launcher).c_str(), file, line);
  if (!sync_each_op() || capturing()) return;
  status = cudaStreamSynchronize(stream());
  if (status == cudaSuccess) return;
  cudaGetLastError();
  fail("[cuda] {} in {} ({}) at {}:{}, found by MOECORE_CUDA_SYNC_EACH_OP's wait after it",
       cudaGetErrorString(status), op, launcher, file, line);
}

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for whoever asks next
    return fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(status));
  }
  return count > 0 ? std::string() : std::string("no CUDA device is visible");
}

DeviceInfo current_device_info() {
  int device = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  return {.name = properties.name,
          .compute_major = properties.major,
          .compute_minor = properties.minor,
          .multiprocessors = properties.multiProcessorCount,
          .memory_bytes = properties.totalGlobalMem};
}

std::string describe(const DeviceInfo& device) {
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB; MX GEMMs {})", device.name,
                     device.compute_major, device.compute_minor, device.multiprocessors,
                     static_cast<double>(device.memory_bytes) / (1024.0 * 1024.0 * 1024.0),
                     has_mx_tensor_cores(device)
                         ? "block-scaled where cuBLASLt has a kernel, else through bf16"
                         : "through bf16: no MX tensor cores");
}

bool has_mx_tensor_cores(const DeviceInfo& device) {
  return device.compute_major >= 10;
}

cudaStream_t stream() {
  // Non-blocking: no implicit ordering with the legacy default stream that libraries may use.
  static const cudaStream_t created = [] {
    cudaStream_t s = nullptr;
    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return created;
}

bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOE_CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

namespace {
std::atomic<bool>& one_launch_experts() {
  static std::atomic<bool> one_launch{false};
  return one_launch;
}
}  // namespace

void set_experts_in_one_launch(bool one_launch) {
  one_launch_experts() = one_launch;
}

bool experts_in_one_launch() {
  return one_launch_experts() || capturing();
}

void synchronize() {
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  throw_pending_index_error();
}

void keep_freed_device_memory() {
  int device = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  MOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep_everything = UINT64_MAX;
  MOE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
}

cublasLtHandle_t cublaslt_handle() {
  static const cublasLtHandle_t created = [] {
    cublasLtHandle_t handle = nullptr;
    MOE_CUBLAS_CHECK(cublasLtCreate(&handle));
    return handle;
  }();
  return created;
}

cublasHandle_t cublas_handle() {
  static const cublasHandle_t created = [] {
    cublasHandle_t handle = nullptr;
    MOE_CUBLAS_CHECK(cublasCreate(&handle));
    MOE_CUBLAS_CHECK(cublasSetStream(handle, stream()));
    // The GEMM workspace as cuBLAS's own (after the stream: cublasSetStream resets a user
    // workspace), so that a GEMM in a stream being captured never allocates one. cuBLASLt's calls
    // share it: both issue on stream(), one after the other.
    MOE_CUBLAS_CHECK(cublasSetWorkspace(handle, gemm_workspace(), kGemmWorkspaceBytes));
    return handle;
  }();
  return created;
}

void* gemm_workspace() {
  static void* const allocated = [] {
    void* p = nullptr;
    MOE_CUDA_CHECK(cudaMalloc(&p, kGemmWorkspaceBytes));
    return p;
  }();
  return allocated;
}

void create_backend_state() {
  stream();
  cublaslt_handle();
  cublas_handle();  // and gemm_workspace()
  prepare_index_checks();
}

}  // namespace moecore::kernels::cuda
