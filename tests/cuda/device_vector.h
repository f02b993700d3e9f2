// A copy of a host vector in device memory, written and read on one stream: the CUDA tests'
// buffers for operations that take device pointers (NCCL's communicator and block exchange).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace moecore::cuda_test {

template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host, cudaStream_t stream = kernels::cuda::stream())
      : size_(host.size()), stream_(stream) {
    MOE_CUDA_CHECK(cudaMalloc(&data_, bytes()));
    write(host);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() {
    cudaStreamSynchronize(stream_);  // nothing may still use what is freed here
    cudaFree(data_);
  }

  T* data() const { return data_; }
  // New contents of the same size, in stream order.
  void write(const std::vector<T>& host) const {
    MOE_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), bytes(), cudaMemcpyHostToDevice, stream_));
  }
  std::vector<T> to_host() const {
    std::vector<T> host(size_);
    MOE_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream_));
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }

  T* data_ = nullptr;
  size_t size_;
  cudaStream_t stream_;
};

}  // namespace moecore::cuda_test
