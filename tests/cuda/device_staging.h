// Host views staged through device memory for one call of a device-view operation: the per-op
// harness (tests/cpp/test_kernel_ops.cpp) hands every backend host vectors, and the CUDA backend
// takes device views. Every view is copied in (outputs too, so that an element the kernel fails
// to write keeps the harness's value and shows up as a mismatch); finish() waits for the stream
// and copies the mutable ones back.
#pragma once

#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "core/tensor_view.h"
#include "kernels/cuda/runtime.h"

namespace moecore::cuda_test {

class DeviceStaging {
 public:
  DeviceStaging() = default;
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
  // Stream-ordered frees: the memory returns to the pool once the work issued before is done (the
  // harness stages hundreds of thousands of calls; a device-wide cudaFree per buffer would make
  // them wait for the device each time).
  ~DeviceStaging() {
    for (void* p : buffers_) cudaFreeAsync(p, kernels::cuda::stream());
  }

  // An absent view (an optional operand not given: no data) is passed on as it is, a host view
  // at null, as the model passes it: the backend's device checks must take it.
  ConstTensorView in(ConstTensorView host) {
    if (host.raw() == nullptr) return host;
    return host.relocated(copy_in(host), Device::kCuda);
  }
  TensorView out(TensorView host) {
    if (host.raw() == nullptr) return host;
    void* device = copy_in(host);
    if (device != nullptr) outputs_.push_back({host, device});
    return host.relocated(device, Device::kCuda);
  }

  void finish() {
    for (const Output& o : outputs_) {
      MOE_CUDA_CHECK(cudaMemcpyAsync(o.host.raw(), o.device, bytes(o.host), cudaMemcpyDeviceToHost,
                                     kernels::cuda::stream()));
    }
    kernels::cuda::synchronize();
  }

 private:
  struct Output {
    TensorView host;
    void* device;
  };

  static size_t bytes(ConstTensorView v) {
    return static_cast<size_t>(v.numel()) * dtype_size(v.dtype());
  }

  // An empty view (no data) stays empty: the operations read "no data" as "not given".
  void* copy_in(ConstTensorView host) {
    if (host.raw() == nullptr || host.numel() == 0) return nullptr;
    void* device = nullptr;
    MOE_CUDA_CHECK(cudaMallocAsync(&device, bytes(host), kernels::cuda::stream()));
    buffers_.push_back(device);
    MOE_CUDA_CHECK(cudaMemcpyAsync(device, host.raw(), bytes(host), cudaMemcpyHostToDevice,
                                   kernels::cuda::stream()));
    return device;
  }

  std::vector<void*> buffers_;
  std::vector<Output> outputs_;
};

}  // namespace moecore::cuda_test
