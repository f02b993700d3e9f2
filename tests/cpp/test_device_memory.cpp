// core/device_memory.h on the guarded device (guarded_device.h: host pages the host cannot touch
// outside the operations): allocations know their device by address, arrays keep std::vector's
// resize rule through copies, host touches crash, and a model layer made of kernels/ops.h calls
// (the SwiGLU MLP, forward and backward) runs on device memory with the CPU's bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "guarded_device.h"
#include "kernels/matmul_precision.h"
#include "model/swiglu_mlp.h"

namespace moecore {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// A host vector's copy in device memory, and back.
DeviceArray<float> to_device(const std::vector<float>& host) {
  DeviceArray<float> array(Device::kCuda, host.size());
  copy_bytes(array.data(), host.data(), host.size() * sizeof(float));
  return array;
}
std::vector<float> to_host(const DeviceArray<float>& array) {
  std::vector<float> host(array.size());
  copy_bytes(host.data(), array.data(), host.size() * sizeof(float));
  return host;
}

TEST(DeviceMemory, HostMemoryIsTheCpus) {
  float on_stack = 0.0f;
  EXPECT_EQ(device_of(&on_stack), Device::kCpu);
  DeviceArray<float> host(Device::kCpu, 5);
  host.data()[4] = 2.0f;  // host arrays are plain host memory
  EXPECT_EQ(device_of(host.data()), Device::kCpu);
  EXPECT_EQ(view(host.data(), {5}).device(), Device::kCpu);
  EXPECT_THROW(DeviceArray<float>(Device::kCuda, 3), Error);  // no device memory registered
}

TEST(DeviceMemory, AllocationsKnowTheirDeviceByAddress) {
  const guarded_device::Scope device;
  DeviceArray<float> a(Device::kCuda, 1000);
  EXPECT_EQ(device_of(a.data()), Device::kCuda);
  EXPECT_EQ(device_of(a.data() + 999), Device::kCuda);
  EXPECT_EQ(view(a.data() + 10, {3, 4}).device(), Device::kCuda);
  {
    DeviceArray<float> b(Device::kCuda, 10);
    EXPECT_EQ(device_of(b.data() + 9), Device::kCuda);
  }
  std::vector<float> host(4);
  EXPECT_EQ(device_of(host.data()), Device::kCpu);
}

TEST(DeviceMemory, ResizeKeepsContentsAndZeroesTheRest) {
  const guarded_device::Scope device;
  DeviceArray<float> a = to_device({1.0f, 2.0f, 3.0f});
  a.resize(5);
  EXPECT_EQ(to_host(a), (std::vector<float>{1.0f, 2.0f, 3.0f, 0.0f, 0.0f}));
  a.resize(2);
  a.resize(4);  // within the capacity kept: the regrown elements are zero again
  EXPECT_EQ(to_host(a), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.0f}));
  DeviceArray<float> b(Device::kCuda);
  b = std::move(a);
  EXPECT_EQ(to_host(b), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.0f}));
  b.zero();
  EXPECT_EQ(to_host(b), (std::vector<float>(4, 0.0f)));
}

TEST(DeviceMemoryDeathTest, TheHostTouchingDeviceMemoryCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const guarded_device::Scope device;
  DeviceArray<float> a(Device::kCuda, 16);
  volatile float* element = a.data() + 3;
  EXPECT_DEATH(*element = 1.0f, "");
  EXPECT_DEATH(static_cast<void>(*element), "");
  // The same touch through copy_bytes is fine.
  const float one = 1.0f;
  copy_bytes(a.data() + 3, &one, sizeof(float));
  EXPECT_EQ(to_host(a)[3], 1.0f);
}

// The SwiGLU MLP (model/swiglu_mlp.h), forward and backward, on device memory and on the host:
// the same operations on the same values, so the same bits, in fp32 and bf16.
TEST(DeviceMemory, SwigluMlpRunsOnDeviceMemoryWithTheCpusBits) {
  const SwigluShape s{.rows = 13, .dim = 24, .hidden = 40};
  const size_t x_n = 13 * 24, gu_n = 13 * 80, act_n = 13 * 40;
  const std::vector<float> x = random_values(x_n, 1), dy = random_values(x_n, 2);
  const std::vector<float> w_gu = random_values(80 * 24, 3), w_down = random_values(24 * 40, 4);
  for (const kernels::MatmulPrecision precision :
       {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
    // On the host.
    std::vector<float> gu(gu_n), act(act_n), y(x_n), dx(x_n), dw_gu(w_gu.size()),
        dw_down(w_down.size()), dact(act_n), dgu(gu_n);
    swiglu_mlp_forward(precision, s, x.data(), view(w_gu.data(), {80, 24}),
                       view(w_down.data(), {24, 40}), gu.data(), act.data(), y.data());
    swiglu_mlp_backward(precision, s, dy.data(), x.data(), view(w_gu.data(), {80, 24}),
                        view(w_down.data(), {24, 40}), gu.data(), act.data(), dx.data(),
                        dw_gu.data(), dw_down.data(), dact.data(), dgu.data(), false);

    // On the device.
    const guarded_device::Scope device;
    const DeviceArray<float> x_d = to_device(x), dy_d = to_device(dy);
    const DeviceArray<float> w_gu_d = to_device(w_gu), w_down_d = to_device(w_down);
    DeviceArray<float> gu_d(Device::kCuda, gu_n), act_d(Device::kCuda, act_n),
        y_d(Device::kCuda, x_n), dx_d(Device::kCuda, x_n), dw_gu_d(Device::kCuda, w_gu.size()),
        dw_down_d(Device::kCuda, w_down.size()), dact_d(Device::kCuda, act_n),
        dgu_d(Device::kCuda, gu_n);
    swiglu_mlp_forward(precision, s, x_d.data(), view(w_gu_d.data(), {80, 24}),
                       view(w_down_d.data(), {24, 40}), gu_d.data(), act_d.data(), y_d.data());
    swiglu_mlp_backward(precision, s, dy_d.data(), x_d.data(), view(w_gu_d.data(), {80, 24}),
                        view(w_down_d.data(), {24, 40}), gu_d.data(), act_d.data(), dx_d.data(),
                        dw_gu_d.data(), dw_down_d.data(), dact_d.data(), dgu_d.data(), false);
    EXPECT_EQ(to_host(y_d), y);
    EXPECT_EQ(to_host(dx_d), dx);
    EXPECT_EQ(to_host(dw_gu_d), dw_gu);
    EXPECT_EQ(to_host(dw_down_d), dw_down);
  }
}

}  // namespace
}  // namespace moecore
