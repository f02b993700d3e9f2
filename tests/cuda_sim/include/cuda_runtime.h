// cudasim: the CUDA runtime as the CUDA backend uses it, emulated on the CPU, so that the backend's
// own sources (src/kernels/cuda/*.cpp and the kernels of *.cu, rewritten by rewrite_launches.cpp
// from `kernel<<<grid, block, shared, stream>>>(...)` to a cudasim::Launch) compile with the host
// compiler and run in a test without a GPU. It shows the kernels' logic (indexing, barriers, warp
// collectives, the launch shapes' limits, the host/device split of every pointer) against the
// CPU reference; it does not show their speed, the memory model of real concurrency, or anything
// cuBLAS's real kernels do (cublas_sim.cpp is a plain GEMM).
//
// Device memory is host memory, allocated apart per call (so that AddressSanitizer's redzones
// sit right after each buffer: an access past a device buffer is a heap overflow there). A stream
// runs its work when it is issued, unless the stream is being captured: then the work is recorded
// into the graph, and a graph launch runs it again. What a real capture refuses (a synchronisation,
// a pageable host copy, cudaMalloc in a global-mode capture) fails here in the same way
// (sim_runtime.cpp lists the calls).
//
// Kernels run block by block on the calling thread; each CUDA thread of a block is a fiber
// (sim_executor.cpp), switched only at __syncthreads, __syncwarp and the warp shuffles, which
// therefore rendezvous the way the hardware's do, and report a barrier or collective the block's
// threads do not all reach.
#pragma once

#include <math.h>  // the device's expf, fmaxf, isnan ... are the host's, in the global namespace

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- Qualifiers. __shared__ objects are a block's: static locals, which the blocks of a launch
// share one after the other (each block runs to its end before the next starts).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define CUDART_CB
#define __launch_bounds__(...)

struct uint3 {
  unsigned int x, y, z;
};
// The vector types the kernels use (vector_types.h): 16 bytes, aligned as one load or store.
struct __align__(16) float4 {
  float x, y, z, w;
};
struct __align__(16) uint4 {
  unsigned int x, y, z, w;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

// ---- Runtime types and constants (the real values of CUDA 13's driver_types.h).
typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
} cudaError_t;

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;
typedef void (*cudaHostFn_t)(void* user_data);

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaMemPoolAttr {
  cudaMemPoolReuseFollowEventDependencies = 1,
  cudaMemPoolReuseAllowOpportunistic = 2,
  cudaMemPoolReuseAllowInternalDependencies = 3,
  cudaMemPoolAttrReleaseThreshold = 4,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
// What cudaFuncGetAttributes reports. The static shared memory is 0: __shared__ objects are
// static locals here, of sizes the emulation does not see.
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int maxDynamicSharedSizeBytes;
};
inline constexpr unsigned int cudaStreamDefault = 0x0;
inline constexpr unsigned int cudaStreamNonBlocking = 0x1;
inline constexpr unsigned int cudaEventDefault = 0x0;
inline constexpr unsigned int cudaEventDisableTiming = 0x2;
inline constexpr unsigned int cudaHostAllocDefault = 0x0;
inline constexpr unsigned int cudaHostAllocPortable = 0x1;
inline constexpr unsigned int cudaHostAllocMapped = 0x2;

struct cudaUUID_t {
  char bytes[16];
};

// The fields the backend reads, and the limits the emulated launches enforce (an H200's). Every
// process has a GPU of its own (its uuid differs), as ranks with one device each do.
struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;       // 48 KiB without opting in
  size_t sharedMemPerBlockOptin;  // 227 KiB with cudaFuncAttributeMaxDynamicSharedMemorySize
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
};

// ---- The runtime API (sim_runtime.cpp).
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** pointer, size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream);
cudaError_t cudaMallocHost(void** pointer, size_t bytes);
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void* pointer);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer);
cudaError_t cudaHostGetDevicePointer(void** device_pointer, void* host_pointer, unsigned int flags);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attribute, void* value);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t function, void* user_data);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// The C++ overloads of cuda_runtime.h that take any pointer type.
template <typename T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T** pointer, size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(pointer), bytes, stream);
}
template <typename T>
cudaError_t cudaMallocHost(T** pointer, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(pointer), bytes);
}
template <typename T>
cudaError_t cudaHostAlloc(T** pointer, size_t bytes, unsigned int flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(pointer), bytes, flags);
}

namespace cudasim {
cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value);
cudaError_t get_function_attributes(cudaFuncAttributes* attributes, const void* function);
}  // namespace cudasim
template <typename Function>
cudaError_t cudaFuncSetAttribute(Function* function, cudaFuncAttribute attribute, int value) {
  return cudasim::set_function_attribute(reinterpret_cast<const void*>(function), attribute, value);
}
template <typename Function>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Function* function) {
  return cudasim::get_function_attributes(attributes, reinterpret_cast<const void*>(function));
}

#include "cudasim/device_functions.h"  // threadIdx, __syncthreads, shuffles, atomics, intrinsics
#include "cudasim/launch.h"            // what a rewritten kernel<<<...>>>(...) calls
