#include "kernels/cuda/device_memory.h"

#include "core/check.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

class CudaMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::kCuda; }

  void* allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t status = cudaMallocAsync(&data, bytes, stream());
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it for the next call
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail("[cuda] out of device memory: {:.1f} MiB asked, {:.1f} MiB free of {:.1f} MiB",
           mib(bytes), mib(free_bytes), mib(total_bytes));
    }
    MOE_CUDA_CHECK(status);
    return data;
  }

  void deallocate(void* data, size_t /*bytes*/) noexcept override {
    // Stream-ordered: the memory returns to the pool once the work issued before is done.
    cudaFreeAsync(data, stream());
  }

  void copy(void* dst, const void* src, size_t bytes, CopyKind kind) override {
    MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
    // Host memory on either side is read or written before the call returns (a pageable
    // buffer's copy is not guaranteed to have left it earlier); a copy within the device is in
    // order with the stream's kernels, which are all that can see it, so it waits for nothing.
    if (kind != CopyKind::kWithinDevice) synchronize();
  }

  void zero(void* data, size_t bytes) override {
    MOE_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream()));
  }

 private:
  static double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
};

}  // namespace

DeviceMemory& device_memory() {
  static CudaMemory memory;
  return memory;
}

}  // namespace moecore::kernels::cuda
