// Device scratch memory ordered on a stream: allocated (cudaMallocAsync) when made, released
// (cudaFreeAsync) when it goes out of scope, after the work issued on the stream in between. The
// pool behind it keeps freed blocks for the next request, and both calls may be captured in a
// CUDA graph (no host synchronisation).
#pragma once

#include <cstddef>

#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) MOE_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream_));
  }
  ~StreamScratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);  // a destructor does not throw
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace moecore::kernels::cuda
