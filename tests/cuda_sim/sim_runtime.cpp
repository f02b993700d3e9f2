// cudasim's runtime API: memory, streams, stream capture and graphs, events, errors and the
// device's description (cuda_runtime.h says what cudasim is and is not). Work issued on a stream
// runs at once unless the stream is being captured; a capture records it, and what a real capture
// refuses fails with CUDA's status: a wait for the stream or a pageable host copy (and, in a
// global-mode capture, a device or event wait, cudaMalloc, cudaFree, cudaHostAlloc) invalidates
// the capture, a free of memory the graph did not allocate is refused. So the backend's "nothing
// in a step waits for the host" is checked here the way the device checks it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim_state.h"

struct CUstream_st {
  bool capturing = false;
  bool global = false;  // cudaStreamCaptureModeGlobal: the process's unsafe calls are refused
  bool invalidated = false;
  std::vector<std::function<void()>> recorded;
  std::vector<void*> graph_allocations;  // cudaMallocAsync inside the capture
};
struct CUevent_st {
  bool timing = true;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
};
// A captured graph and its instances share the recorded work and the memory the graph allocated,
// which lives as long as any of them (its addresses are baked into the work).
struct CapturedWork {
  std::vector<std::function<void()>> work;
  std::vector<void*> allocations;
  ~CapturedWork();
};
struct CUgraph_st {
  std::shared_ptr<CapturedWork> captured;
};
struct CUgraphExec_st {
  std::shared_ptr<CapturedWork> captured;
};
struct CUmemPoolHandle_st {};

namespace cudasim {
namespace {

// Memory a capture allocates (cudaMallocAsync) is the graph's when the capture also frees it:
// its address is baked into the graph and stays valid for every launch, until the graph is
// destroyed. What the capture allocates and does not free is the program's after the capture,
// as CUDA's graph memory nodes have it, and cudaFree(Async) releases it then.
struct Allocation {
  size_t bytes;
  MemoryKind kind;
  CUstream_st* captured_by;  // the capture under way that allocated it, or none
  bool freed_in_graph;       // that capture freed it: the graph's
  // A graph's memory is live between its allocation and its free in each launch of the graph
  // (refilled with 0xff at the allocation, as fresh memory); a kernel given it outside that
  // span gets an illegal address.
  bool live;
};

struct State {
  std::map<uintptr_t, Allocation> allocations;
  cudaError_t last_error = cudaSuccess;
  cudaError_t sticky_error = cudaSuccess;
  // Whether a wait has reported sticky_error to the host: until then cudaGetLastError does not
  // see it, as a kernel's fault reaches the host only when it waits for the device.
  bool sticky_error_seen = false;
  std::map<const void*, size_t> max_dynamic_shared;
  CUstream_st legacy_stream;
  CUmemPoolHandle_st pool;
  std::vector<CUstream_st*> global_captures;  // global-mode captures under way
};

State& state() {
  static State s;
  return s;
}

CUstream_st* resolve(cudaStream_t stream) {
  return stream != nullptr ? stream : &state().legacy_stream;
}

// The allocation holding [p, p + bytes], or none.
const Allocation* find(const void* p, size_t bytes = 0) {
  State& s = state();
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  if (address + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

// Enters [p, p + bytes) as an allocation, fresh: a GPU's fresh memory holds garbage; here all
// ones, a NaN in every float and bf16 and -1 in every integer, so that a kernel reading what
// nothing wrote shows in its results (the same way every run) instead of passing on a lucky zero.
void enter_allocation(void* p, size_t bytes, MemoryKind kind, CUstream_st* captured_by) {
  std::memset(p, 0xff, bytes);
  state().allocations[reinterpret_cast<uintptr_t>(p)] = {bytes, kind, captured_by, false, true};
}

void* allocate(size_t bytes, MemoryKind kind, CUstream_st* captured_by) {
  void* p = nullptr;
  // At least one byte, so that every allocation has its own address (as cudaMalloc's do).
  if (posix_memalign(&p, 256, bytes > 0 ? bytes : 1) != 0) return nullptr;
  enter_allocation(p, bytes, kind, captured_by);
  return p;
}

// A call that would wait for the device, or one a capture cannot hold, made while a stream is
// captured: CUDA's status, and the capture is spoiled.
cudaError_t refuse_in_capture(CUstream_st* stream, const char* what) {
  stream->invalidated = true;
  record_error(cudaErrorStreamCaptureUnsupported, false,
               std::string(what) + " while the stream is captured");
  return cudaErrorStreamCaptureUnsupported;
}

// A call no global-mode capture allows (it would wait for the device or change its memory map):
// refused while one is under way, which spoils every such capture.
cudaError_t refuse_in_global_capture(const char* what) {
  for (CUstream_st* s : state().global_captures) s->invalidated = true;
  record_error(cudaErrorStreamCaptureUnsupported, false,
               std::string(what) + " while a stream is captured");
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t fail(cudaError_t error, const std::string& message) {
  record_error(error, false, message);
  return error;
}

// Why the device could not dereference `pointer` (empty when it can, or when it is null).
std::string unaddressable(const void* pointer) {
  if (pointer == nullptr) return {};
  const Allocation* a = find(pointer);
  if (a == nullptr) return "points to host memory the device cannot address";
  if (!a->live) return "points to a graph's memory outside its allocation in the graph";
  return {};
}

}  // namespace

int compute_capability_major() {
  static const int major = [] {
    const char* arch = std::getenv("CUDASIM_ARCH");
    if (arch == nullptr || std::strcmp(arch, "sm_90") == 0) return 9;
    if (std::strcmp(arch, "sm_100") == 0) {
      // Whether the MX GEMMs took cuBLASLt's block-scaled path, said at exit (ctest
      // CudaSim.Blackwell fails on a count of 0).
      std::atexit([] {
        std::fprintf(stderr, "cudasim: %lld block-scaled GEMMs ran\n",
                     static_cast<long long>(block_scaled_gemms_run()));
      });
      return 10;
    }
    std::fprintf(stderr, "cudasim: CUDASIM_ARCH=%s: expected sm_90 (the default) or sm_100\n",
                 arch);
    std::exit(2);
  }();
  return major;
}

bool inside_device_allocation(const void* pointer, size_t bytes) {
  const Allocation* a = find(pointer, bytes);
  return a != nullptr && a->live && a->kind == MemoryKind::kDevice;
}

MemoryKind memory_kind(const void* pointer) {
  const Allocation* a = find(pointer);
  return a == nullptr ? MemoryKind::kPageableHost : a->kind;
}

void register_device_memory(void* pointer, size_t bytes) {
  enter_allocation(pointer, bytes, MemoryKind::kDevice, nullptr);
}

void unregister_device_memory(void* pointer) {
  state().allocations.erase(reinterpret_cast<uintptr_t>(pointer));
}

void issue_stream_work(cudaStream_t stream, std::function<void()> work) {
  CUstream_st* s = resolve(stream);
  if (s->capturing) {
    if (!s->invalidated) s->recorded.push_back(std::move(work));
    return;
  }
  if (has_sticky_error()) return;
  work();
}

void record_error(cudaError_t error, bool sticky, const std::string& message) {
  State& s = state();
  std::fprintf(stderr, "cudasim: %s: %s\n", cudaGetErrorName(error), message.c_str());
  if (!sticky) {
    s.last_error = error;
  } else if (s.sticky_error == cudaSuccess) {
    s.sticky_error = error;
  }
}

cudaError_t wait_for_device() {
  State& s = state();
  if (s.sticky_error != cudaSuccess) s.sticky_error_seen = true;
  return s.sticky_error;
}

bool has_sticky_error() {
  return state().sticky_error != cudaSuccess;
}

void clear_errors() {
  state().sticky_error = cudaSuccess;
  state().sticky_error_seen = false;
  state().last_error = cudaSuccess;
}

size_t max_dynamic_shared_bytes(const void* kernel) {
  const auto it = state().max_dynamic_shared.find(kernel);
  return it == state().max_dynamic_shared.end() ? kDefaultSharedBytes : it->second;
}

cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: an attribute cudasim lacks");
  if (value < 0 || static_cast<size_t>(value) > kOptInSharedBytes)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                           " bytes of dynamic shared memory exceed the 227 KiB");
  state().max_dynamic_shared[function] = static_cast<size_t>(value);
  return cudaSuccess;
}

cudaError_t get_function_attributes(cudaFuncAttributes* attributes, const void* function) {
  *attributes = {};
  attributes->maxThreadsPerBlock = 1024;
  attributes->maxDynamicSharedSizeBytes = static_cast<int>(max_dynamic_shared_bytes(function));
  return cudaSuccess;
}

void issue_launch(const LaunchShape& shape, std::vector<const void*> pointer_arguments,
                  std::function<void()> body) {
  const std::string kernel = shape.kernel_name;
  const size_t threads = size_t{shape.block.x} * shape.block.y * shape.block.z;
  if (threads == 0 || threads > 1024 || shape.block.z > 64 || shape.grid.x == 0 ||
      shape.grid.y == 0 || shape.grid.z == 0 || shape.grid.x > 0x7fffffffu ||
      shape.grid.y > 65535 || shape.grid.z > 65535) {
    record_error(cudaErrorInvalidConfiguration, false,
                 kernel + ": grid " + std::to_string(shape.grid.x) + "," +
                     std::to_string(shape.grid.y) + "," + std::to_string(shape.grid.z) +
                     " of blocks " + std::to_string(shape.block.x) + "," +
                     std::to_string(shape.block.y) + "," + std::to_string(shape.block.z) +
                     " is outside the device's limits");
    return;
  }
  if (shape.shared_bytes > max_dynamic_shared_bytes(shape.kernel)) {
    record_error(cudaErrorInvalidValue, false,
                 kernel + ": " + std::to_string(shape.shared_bytes) +
                     " bytes of dynamic shared memory without cudaFuncSetAttribute raising the "
                     "kernel's limit (48 KiB)");
    return;
  }
  // The pointers are checked when the launch runs (a graph's replay may come after its memory
  // went): one the device could not dereference is its illegal address, and nothing runs.
  issue_stream_work(shape.stream, [shape, body = std::move(body),
                                   pointer_arguments = std::move(pointer_arguments)] {
    for (size_t i = 0; i < pointer_arguments.size(); ++i) {
      const std::string why = unaddressable(pointer_arguments[i]);
      if (!why.empty()) {
        record_error(cudaErrorIllegalAddress, true,
                     std::string(shape.kernel_name) + ": pointer argument " +
                         std::to_string(i + 1) + " " + why);
        return;
      }
    }
    std::string failure;
    if (!execute_launch(shape, body, failure)) record_error(cudaErrorLaunchFailure, true, failure);
  });
}

}  // namespace cudasim

using cudasim::MemoryKind;

CapturedWork::~CapturedWork() {
  for (void* p : allocations) {
    cudasim::state().allocations.erase(reinterpret_cast<uintptr_t>(p));
    std::free(p);
  }
}

// ---- Device and errors.

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudasim::fail(cudaErrorInvalidDevice, "cudaSetDevice");
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudasim::fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties");
  *p = {};
  const int major = cudasim::compute_capability_major();
  std::snprintf(p->name, sizeof p->name, "cudasim (an sm_%d0 GPU emulated on the CPU)", major);
  // This process's own GPU: its process id and its host's name, so that two ranks never share
  // one (NCCL's communicator refuses two ranks on one device, by uuid).
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  const pid_t pid = getpid();
  std::memcpy(p->uuid.bytes, &pid, sizeof pid);
  const size_t host_hash = std::hash<std::string>{}(host);
  static_assert(sizeof pid + sizeof host_hash <= sizeof p->uuid.bytes);
  std::memcpy(p->uuid.bytes + sizeof pid, &host_hash, sizeof host_hash);
  p->totalGlobalMem = size_t{141} << 30;
  p->sharedMemPerBlock = cudasim::kDefaultSharedBytes;
  p->sharedMemPerBlockOptin = cudasim::kOptInSharedBytes;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = major;
  p->minor = 0;
  p->multiProcessorCount = major == 9 ? 132 : 148;  // an H200's, a B200's
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  cudaDeviceProp p;
  const cudaError_t got = cudaGetDeviceProperties(&p, device);
  if (got != cudaSuccess) return got;
  switch (attribute) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      return cudaSuccess;
  }
  return cudasim::fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: an attribute cudasim lacks");
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = size_t{141} << 30;
  *free_bytes = *total_bytes;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  cudasim::State& s = cudasim::state();
  if (s.sticky_error_seen) return s.sticky_error;
  const cudaError_t e = s.last_error;
  s.last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  cudasim::State& s = cudasim::state();
  return s.sticky_error_seen ? s.sticky_error : s.last_error;
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchTimeout:
      return "cudaErrorLaunchTimeout";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorHardwareStackError:
      return "cudaErrorHardwareStackError";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress:
      return "cudaErrorMisalignedAddress";
    case cudaErrorInvalidAddressSpace:
      return "cudaErrorInvalidAddressSpace";
    case cudaErrorInvalidPc:
      return "cudaErrorInvalidPc";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return cudaGetErrorName(error);
  }
}
cudaError_t cudaDeviceSynchronize() {
  if (!cudasim::state().global_captures.empty())
    return cudasim::refuse_in_global_capture("cudaDeviceSynchronize");
  return cudasim::wait_for_device();
}

// ---- Memory.

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (!cudasim::state().global_captures.empty())
    return cudasim::refuse_in_global_capture("cudaMalloc");
  *pointer = cudasim::allocate(bytes, MemoryKind::kDevice, nullptr);
  return *pointer != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  if (!cudasim::state().global_captures.empty())
    return cudasim::refuse_in_global_capture("cudaFree");
  return cudaFreeAsync(pointer, nullptr);
}
cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = cudasim::resolve(stream);
  *pointer = cudasim::allocate(bytes, MemoryKind::kDevice, s->capturing ? s : nullptr);
  if (*pointer == nullptr) return cudaErrorMemoryAllocation;
  if (s->capturing) {
    s->graph_allocations.push_back(*pointer);
    const auto address = reinterpret_cast<uintptr_t>(*pointer);
    s->recorded.push_back([address, bytes] {
      cudasim::state().allocations.at(address).live = true;
      std::memset(reinterpret_cast<void*>(address), 0xff, bytes);
    });
  }
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  if (pointer == nullptr) return cudaSuccess;
  CUstream_st* s = cudasim::resolve(stream);
  cudasim::State& st = cudasim::state();
  const auto it = st.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == st.allocations.end() || it->second.kind != MemoryKind::kDevice)
    return cudasim::fail(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return");
  if (s->capturing) {
    // A graph may free only what it allocated; that memory lives until the graph is destroyed.
    if (it->second.captured_by != s)
      return cudasim::fail(cudaErrorInvalidValue,
                           "cudaFreeAsync inside a capture of memory the graph did not allocate");
    it->second.freed_in_graph = true;
    const uintptr_t address = it->first;
    s->recorded.push_back([address] { cudasim::state().allocations.at(address).live = false; });
    return cudaSuccess;
  }
  if (it->second.captured_by != nullptr || it->second.freed_in_graph)
    return cudasim::fail(cudaErrorInvalidValue, "cudaFreeAsync of a graph's memory");
  st.allocations.erase(it);
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
  return cudaHostAlloc(pointer, bytes, cudaHostAllocDefault);
}
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int /*flags*/) {
  if (!cudasim::state().global_captures.empty())
    return cudasim::refuse_in_global_capture("cudaHostAlloc");
  *pointer = cudasim::allocate(bytes, MemoryKind::kPinnedHost, nullptr);
  return *pointer != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* pointer) {
  cudasim::State& st = cudasim::state();
  const auto it = st.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == st.allocations.end() || it->second.kind != MemoryKind::kPinnedHost)
    return cudasim::fail(cudaErrorInvalidValue, "cudaFreeHost of a pointer it did not allocate");
  st.allocations.erase(it);
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** device_pointer, void* host_pointer,
                                     unsigned int /*flags*/) {
  if (cudasim::memory_kind(host_pointer) != MemoryKind::kPinnedHost)
    return cudasim::fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer of pageable memory");
  *device_pointer = host_pointer;
  return cudaSuccess;
}
// Device memory (a graph's too, live or not), pinned host memory, or memory CUDA does not know.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  *attributes = {};
  const cudasim::Allocation* a = cudasim::find(pointer);
  if (a == nullptr) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    return cudaSuccess;
  }
  attributes->type = a->kind == MemoryKind::kDevice ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attributes->devicePointer = const_cast<void*>(pointer);
  attributes->hostPointer = a->kind == MemoryKind::kDevice ? nullptr : const_cast<void*>(pointer);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int /*device*/) {
  *pool = &cudasim::state().pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}

namespace {

// Whether `bytes` at `p` are where a copy's side says: inside one live allocation the device can
// address (device or mapped pinned memory) on the device's side, outside device memory on the
// host's. cudaMemcpyDefault takes each side from where its pointer is.
bool where_side_says(const void* p, size_t bytes, cudaMemcpyKind kind, bool device_by_kind) {
  const cudasim::Allocation* a = cudasim::find(p, bytes);
  const bool device_side = kind == cudaMemcpyDefault
                               ? cudasim::memory_kind(p) != MemoryKind::kPageableHost
                               : device_by_kind;
  if (device_side) return a != nullptr && a->live;
  return a == nullptr || a->kind != MemoryKind::kDevice;
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!where_side_says(dst, bytes, kind,
                       kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) ||
      !where_side_says(src, bytes, kind,
                       kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice))
    return cudasim::fail(cudaErrorInvalidValue,
                         "cudaMemcpyAsync: " + std::to_string(bytes) +
                             " bytes not where the copy's kind says (or past their allocation)");
  CUstream_st* s = cudasim::resolve(stream);
  const bool pageable = cudasim::memory_kind(dst) == MemoryKind::kPageableHost ||
                        cudasim::memory_kind(src) == MemoryKind::kPageableHost;
  if (s->capturing && pageable)
    return cudasim::refuse_in_capture(s, "a copy to or from pageable host memory");
  cudasim::issue_stream_work(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t issued = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  return issued != cudaSuccess ? issued : cudaStreamSynchronize(nullptr);
}
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const cudasim::Allocation* a = cudasim::find(pointer, bytes);
  if (a == nullptr || !a->live)
    return cudasim::fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(bytes) +
                                                    " bytes not inside one device allocation");
  cudasim::issue_stream_work(stream, [=] { std::memset(pointer, value, bytes); });
  return cudaSuccess;
}

// ---- Streams, capture, graphs.

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int /*flags*/) {
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = cudasim::resolve(stream);
  if (s->capturing) return cudasim::refuse_in_capture(s, "cudaStreamSynchronize");
  return cudasim::wait_for_device();
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t function, void* user_data) {
  cudasim::issue_stream_work(stream, [=] { function(user_data); });
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  CUstream_st* s = cudasim::resolve(stream);
  if (stream == nullptr || s->capturing)
    return cudasim::fail(cudaErrorInvalidValue, "cudaStreamBeginCapture");
  s->capturing = true;
  s->invalidated = false;
  s->recorded.clear();
  s->graph_allocations.clear();
  s->global = mode == cudaStreamCaptureModeGlobal;
  if (s->global) cudasim::state().global_captures.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = cudasim::resolve(stream);
  if (!s->capturing) return cudasim::fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture");
  s->capturing = false;
  std::erase(cudasim::state().global_captures, s);
  auto captured = std::make_shared<CapturedWork>();
  captured->work = std::move(s->recorded);
  for (void* p : s->graph_allocations) {
    cudasim::Allocation& a = cudasim::state().allocations.at(reinterpret_cast<uintptr_t>(p));
    a.captured_by = nullptr;
    if (a.freed_in_graph) {
      a.live = false;  // until a launch of the graph allocates it
      captured->allocations.push_back(p);
    }
  }
  s->recorded.clear();
  s->graph_allocations.clear();
  if (s->invalidated) {
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = new CUgraph_st{std::move(captured)};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const CUstream_st* s = cudasim::resolve(stream);
  *status = !s->capturing    ? cudaStreamCaptureStatusNone
            : s->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
  if (graph == nullptr) return cudasim::fail(cudaErrorInvalidValue, "cudaGraphInstantiate");
  *exec = new CUgraphExec_st{graph->captured};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return cudasim::fail(cudaErrorInvalidValue, "cudaGraphLaunch");
  const std::shared_ptr<CapturedWork> captured = exec->captured;
  cudasim::issue_stream_work(stream, [captured] {
    for (const std::function<void()>& work : captured->work) {
      if (cudasim::has_sticky_error()) return;
      work();
    }
  });
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

// ---- Events: a recorded event holds the host's time when the stream reached it.

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = new CUevent_st;
  (*event)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cudasim::issue_stream_work(stream, [event] {
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t /*event*/) {
  if (!cudasim::state().global_captures.empty())
    return cudasim::refuse_in_global_capture("cudaEventSynchronize");
  return cudasim::wait_for_device();
}
cudaError_t cudaEventQuery(cudaEvent_t /*event*/) {
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start->timing || !end->timing || !start->recorded || !end->recorded)
    return cudasim::fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
