// kernels/ops.h's operations pass each call to the backend of the memory their views are in
// (kernels/device_backends.h). Without a GPU, the test gives the device a real backend that runs
// on host memory (the plain-loop oracle's operations) and tags host buffers as that device's: the
// call must reach that table, with its arguments unchanged, and give the oracle's result; host
// views must still reach the CPU backend; mixed devices, a device without a backend and a missing
// entry are errors that name the operation.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/device_backends.h"
#include "kernels/ops.h"

namespace moecore {
namespace {

// Registers `backend` for Device::kCuda for the test's lifetime, and none afterwards.
class DeviceBackendScope {
 public:
  explicit DeviceBackendScope(const kernels::KernelBackend* backend) {
    kernels::register_device_backend(Device::kCuda, backend);
  }
  ~DeviceBackendScope() { kernels::register_device_backend(Device::kCuda, nullptr); }
  DeviceBackendScope(const DeviceBackendScope&) = delete;
  DeviceBackendScope& operator=(const DeviceBackendScope&) = delete;
};

// The device's table: the oracle's operations on the same memory seen as host memory (the
// oracle checks that its views are on the host), counting the calls that reach it.
int g_device_calls = 0;

template <bool kMutable>
BasicTensorView<kMutable> on_host(const BasicTensorView<kMutable>& v) {
  EXPECT_TRUE(v.raw() == nullptr || v.device() == Device::kCuda);
  return v.relocated(v.raw(), Device::kCpu);
}

void device_scale(ConstTensorView x, float factor, TensorView out) {
  ++g_device_calls;
  kernels::reference_backend().scale(on_host(x), factor, on_host(out));
}

void device_sum_of_squares(ConstTensorView values, TensorView total) {
  ++g_device_calls;
  kernels::reference_backend().sum_of_squares(on_host(values), on_host(total));
}

void device_router_topk_forward(ConstTensorView logits, ConstTensorView selection_bias,
                                const RouterTopkOptions& options, TensorView scores,
                                TensorView topk_index, TensorView topk_weight,
                                TensorView expert_counts) {
  ++g_device_calls;
  kernels::reference_backend().router_topk_forward(on_host(logits), on_host(selection_bias),
                                                   options, on_host(scores), on_host(topk_index),
                                                   on_host(topk_weight), on_host(expert_counts));
}

std::string dispatch_error_of(const auto& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DeviceDispatch, HostViewsRunOnTheCpuBackend) {
  EXPECT_EQ(kernels::device_backend(Device::kCpu), &kernels::cpu_backend());
  const std::vector<float> x = {1.0f, -2.0f, 3.5f};
  std::vector<float> out(3);
  kernels::scale(view(x.data(), {3}), 2.0f, view(out.data(), {3}));
  EXPECT_EQ(out, (std::vector<float>{2.0f, -4.0f, 7.0f}));
}

TEST(DeviceDispatch, DeviceViewsRunOnTheDevicesBackend) {
  kernels::KernelBackend device_table = kernels::reference_backend();
  device_table.name = "host-as-device";
  device_table.scale = &device_scale;
  device_table.sum_of_squares = &device_sum_of_squares;
  device_table.router_topk_forward = &device_router_topk_forward;
  const DeviceBackendScope scope(&device_table);
  EXPECT_EQ(kernels::device_backend(Device::kCuda), &device_table);

  const std::vector<float> x = {1.0f, -2.0f, 3.5f};
  std::vector<float> out(3);
  g_device_calls = 0;
  kernels::scale(ConstTensorView(x.data(), {3}, DType::kF32, Device::kCuda), 0.5f,
                 TensorView(out.data(), {3}, DType::kF32, Device::kCuda));
  EXPECT_EQ(g_device_calls, 1);
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.0f, 1.75f}));

  // A reduction writes its total where its values are (the oracle's sum here): no operation
  // hands the host a device's value, so none is a host read (a wait on a GPU).
  const HostReadLog log;
  double sum = 0.0;
  kernels::sum_of_squares(ConstTensorView(x.data(), {3}, DType::kF32, Device::kCuda),
                          TensorView(&sum, {1}, DType::kF64, Device::kCuda));
  EXPECT_EQ(sum, 1.0 + 4.0 + 12.25);
  EXPECT_EQ(g_device_calls, 2);
  EXPECT_TRUE(log.reads().empty());

  // Empty views (absent optional operands) belong to no device.
  const std::vector<float> logits = {0.1f, 0.7f, -0.3f, 0.2f};
  std::vector<float> scores(4), weight(2);
  std::vector<int32_t> index(2);
  std::vector<int64_t> counts(2);
  RouterTopkOptions options;
  kernels::router_topk_forward(ConstTensorView(logits.data(), {2, 2}, DType::kF32, Device::kCuda),
                               ConstTensorView{}, options,
                               TensorView(scores.data(), {2, 2}, DType::kF32, Device::kCuda),
                               TensorView(index.data(), {2, 1}, DType::kI32, Device::kCuda),
                               TensorView(weight.data(), {2, 1}, DType::kF32, Device::kCuda),
                               TensorView(counts.data(), {2}, DType::kI64, Device::kCuda));
  EXPECT_EQ(index, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(counts, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g_device_calls, 3);
  EXPECT_TRUE(log.reads().empty());  // the routing's outputs, counts included, stay on the device
  // A read the backend notes (the CUDA grouped GEMMs' offsets) is logged with its phase; the same
  // read again is counted, not listed twice.
  note_host_read("grouped_gemm_forward");
  note_host_read("grouped_gemm_forward");
  ASSERT_EQ(log.reads().size(), 1u);
  EXPECT_EQ(log.reads()[0].what, "grouped_gemm_forward");
  EXPECT_EQ(log.reads()[0].phase, "none");
  EXPECT_EQ(log.reads()[0].count, 2);
}

TEST(DeviceDispatch, MixedDevicesAreAnErrorNamingTheOperation) {
  const DeviceBackendScope scope(&kernels::reference_backend());
  const std::vector<float> x = {1.0f, 2.0f};
  std::vector<float> out(2);
  const std::string message = dispatch_error_of([&] {
    kernels::add(view(x.data(), {2}), ConstTensorView(x.data(), {2}, DType::kF32, Device::kCuda),
                 view(out.data(), {2}));
  });
  EXPECT_EQ(message,
            "[add] its views are in cpu and in cuda memory: one operation's views are all in one "
            "device's memory");
}

TEST(DeviceDispatch, ADeviceWithoutABackendIsAnError) {
  kernels::register_device_backend(Device::kCuda, nullptr);
  const std::vector<float> x = {1.0f, 2.0f};
  std::vector<float> out(2);
  const std::string message = dispatch_error_of([&] {
    kernels::swiglu_forward(ConstTensorView(x.data(), {1, 2}, DType::kF32, Device::kCuda),
                            TensorView(out.data(), {1, 1}, DType::kF32, Device::kCuda));
  });
  EXPECT_EQ(message,
            "[swiglu_forward] its views are in cuda memory, but no cuda backend is active (this "
            "build has none, or the process did not select that device)");
  EXPECT_NE(dispatch_error_of([] { kernels::register_device_backend(Device::kCpu, nullptr); }),
            "(no error)");
}

TEST(DeviceDispatch, AMissingEntryIsAnErrorNamingTheBackend) {
  kernels::KernelBackend partial = kernels::reference_backend();
  partial.name = "partial";
  partial.cached_attention_forward = nullptr;
  const DeviceBackendScope scope(&partial);
  std::vector<float> q(8), cache(8), out(8);
  const std::string message = dispatch_error_of([&] {
    kernels::cached_attention_forward(
        ConstTensorView(q.data(), {1, 1, 1, 8}, DType::kF32, Device::kCuda),
        ConstTensorView(cache.data(), {1, 1, 1, 8}, DType::kF32, Device::kCuda),
        ConstTensorView(cache.data(), {1, 1, 1, 8}, DType::kF32, Device::kCuda), 0,
        TensorView(out.data(), {1, 1, 1, 8}, DType::kF32, Device::kCuda));
  });
  EXPECT_EQ(message, "[cached_attention_forward] is not implemented on the partial backend");
}

}  // namespace
}  // namespace moecore
