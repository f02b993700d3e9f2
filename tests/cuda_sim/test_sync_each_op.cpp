// MOECORE_CUDA_SYNC_EACH_OP (src/kernels/cuda/runtime.h's sync_each_op) on the emulated GPU, whose
// kernels' faults reach the host at the next wait, as on the device (sim_state.h). An operation's
// kernel is made to fault by a view that says device but holds host memory (the backend checks
// the tag, the emulated device the address). Without the switch the operation returns and the
// next synchronisation reports the fault, naming no operation but the switch; with it the
// operation throws, naming itself and its launcher. Each test forgets the fault after, as the
// emulator's own tests do (test_emulator.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/tensor_view.h"
#include "device_vector.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "sim_state.h"

namespace moecore::cuda_test {
namespace {

namespace cuda = kernels::cuda;

class CudasimSyncEachOp : public ::testing::Test {
 protected:
  void TearDown() override {
    cuda::set_sync_each_op(switch_before_);
    cudasim::clear_errors();
  }

  // scale() from host memory tagged as the device's into `out`: its kernel's pointer argument
  // faults when the kernel runs. The emulator's line about it is captured (ctest's entries fail
  // on it elsewhere).
  void scale_from_host_memory() {
    ::testing::internal::CaptureStderr();
    try {
      cuda::scale(TensorView(host_.data(), {kCount}, DType::kF32, Device::kCuda), 2.0f,
                  TensorView(out_.data(), {kCount}, DType::kF32, Device::kCuda));
    } catch (...) {
      ::testing::internal::GetCapturedStderr();
      throw;
    }
    ::testing::internal::GetCapturedStderr();
  }

  // What synchronize() throws, or "" when it returns.
  static std::string synchronize_error() {
    try {
      cuda::synchronize();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  static constexpr int64_t kCount = 16;
  const bool switch_before_ = cuda::sync_each_op();
  std::vector<float> host_ = std::vector<float>(kCount, 1.0f);
  DeviceVector<float> out_{std::vector<float>(kCount, 0.0f)};
};

TEST_F(CudasimSyncEachOp, WithoutItTheNextWaitReportsTheFaultAndPointsAtTheSwitch) {
  cuda::set_sync_each_op(false);
  EXPECT_NO_THROW(scale_from_host_memory());
  const std::string message = synchronize_error();
  EXPECT_NE(message.find("[cuda] an illegal memory access was encountered in "
                         "cudaStreamSynchronize(stream())"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("MOECORE_CUDA_SYNC_EACH_OP=1 makes every operation wait"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("launch_scale"), std::string::npos) << message;
}

TEST_F(CudasimSyncEachOp, WithItTheOperationWhoseKernelFaultedNamesItself) {
  cuda::set_sync_each_op(true);
  std::string message;
  try {
    scale_from_host_memory();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("[cuda] an illegal memory access was encountered in scale "
                         "(launch_scale) at "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("src/kernels/cuda/elementwise.cpp:"), std::string::npos) << message;
  EXPECT_NE(message.find("found by MOECORE_CUDA_SYNC_EACH_OP's wait after it"), std::string::npos)
      << message;
}

// The environment sets the switch at the first call: ctest CudaSim.SyncEachOpFromTheEnvironment
// runs this test alone with MOECORE_CUDA_SYNC_EACH_OP=1; elsewhere it holds the switch off.
TEST_F(CudasimSyncEachOp, TheEnvironmentSetsTheSwitch) {
  const char* value = std::getenv("MOECORE_CUDA_SYNC_EACH_OP");
  EXPECT_EQ(cuda::sync_each_op(), value != nullptr && std::string_view(value) == "1");
}

}  // namespace
}  // namespace moecore::cuda_test
