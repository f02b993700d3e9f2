#include "kernels/cuda/cuda_graphs.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "core/check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

class CudaGraph final : public DeviceGraph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Under MOECORE_CUDA_SYNC_EACH_OP the captured operations did not wait (runtime.h's
  // sync_each_op): the replay waits for them all instead.
  void replay() override {
    MOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream()));
    MOE_CUDA_CHECK_LAUNCH("CUDA graph replay", "cudaGraphLaunch");
  }

 private:
  cudaGraphExec_t exec_;
};

class CudaGraphs final : public DeviceGraphs {
 public:
  void begin_capture() override {
    release_frees_inside_capture();
    MOE_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
  }

  std::unique_ptr<DeviceGraph> end_capture() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream(), &graph);
    const int64_t frees = release_frees_inside_capture();
    if (ended != cudaSuccess) {
      cudaGetLastError();  // the capture's error is the caller's to report, not the next call's
      if (graph != nullptr) cudaGraphDestroy(graph);
      fail(
          "[cuda] the captured work broke its CUDA graph's capture ({}): a wait for the stream "
          "or a copy between host and device inside it",
          cudaGetErrorString(ended));
    }
    if (frees > 0) {
      cudaGraphDestroy(graph);
      fail(
          "[cuda] {} device allocations were freed inside a CUDA graph's capture: a captured "
          "step must keep its buffers",
          frees);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    MOE_CUDA_CHECK(made);
    return std::make_unique<CudaGraph>(exec);
  }

  void abandon_capture() noexcept override {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream(), &graph);
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    release_frees_inside_capture();
  }
};

}  // namespace

DeviceGraphs& cuda_graphs() {
  static CudaGraphs graphs;
  return graphs;
}

}  // namespace moecore::kernels::cuda
