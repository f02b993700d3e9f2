// The CUDA backend beyond the per-op harness: the device it names, errors that name the failing
// call or the misplaced view, repeatable results, and GEMM operands that start inside a buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/device_graph.h"
#include "core/device_memory.h"
#include "device_staging.h"
#include "device_vector.h"
#include "kernel_harness.h"
#include "kernels/cuda/cuda_graphs.h"
#include "kernels/cuda/device_selection.h"
#include "kernels/cuda/grouped_gemm_device.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/device_backends.h"
#include "kernels/ops.h"

namespace moecore::cuda_test {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

TEST(CudaBackend, NamesTheDevice) {
  const kernels::cuda::DeviceInfo device = kernels::cuda::current_device_info();
  EXPECT_FALSE(device.name.empty());
  EXPECT_GT(device.multiprocessors, 0);
  EXPECT_GT(device.memory_bytes, size_t{0});
  EXPECT_NE(kernels::cuda::describe(device).find(device.name), std::string::npos);
}

TEST(CudaBackend, AFailedCallNamesItselfAndItsPlace) {
  try {
    MOE_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL() << "cudaSetDevice of a device that does not exist succeeded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[cuda]"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaSetDevice(1 << 20)"), std::string::npos) << message;
    EXPECT_NE(message.find("test_cuda_backend.cpp"), std::string::npos) << message;
  }
  // The failure is reported once: the next launch's check does not see it again.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Row numbers held in device memory are checked on the device, without waiting: the operation
// returns, its kernels leave the bad row alone, and the next synchronisation throws the first bad
// index of the first operation that had one, naming it; the error is then cleared.
TEST(CudaBackend, AnIndexOutsideItsTensorIsReportedAtTheNextSynchronisation) {
  const std::vector<float> src = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<int32_t> inside = {1, 0}, outside = {0, 2}, negative = {-1, 0};
  DeviceStaging s;
  const ConstTensorView src_on_gpu = s.in(view(src.data(), {2, 2}));
  std::vector<float> dst(4, -1.0f);
  const TensorView dst_on_gpu = s.out(view(dst.data(), {2, 2}));
  kernels::cuda::gather_rows(src_on_gpu, s.in(view(outside.data(), {2})), dst_on_gpu);
  kernels::cuda::gather_rows(src_on_gpu, s.in(view(negative.data(), {2})), dst_on_gpu);
  try {
    kernels::cuda::synchronize();
    FAIL() << "an index outside its tensor was not reported";
  } catch (const Error& e) {
    // -1 is gather_rows' "no row" (a zero row), so the range it names starts there.
    EXPECT_NE(std::string(e.what()).find("[gather_rows] src_row[1]=2 is outside [-1, 2)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(kernels::cuda::synchronize());  // reported once
  kernels::cuda::gather_rows(src_on_gpu, s.in(view(inside.data(), {2})), dst_on_gpu);
  s.finish();  // waits, and nothing is pending
  EXPECT_EQ(dst, (std::vector<float>{3.0f, 4.0f, 1.0f, 2.0f}));
}

TEST(CudaBackend, RejectsHostViews) {
  std::vector<float> a(6), b(6), out(6);
  try {
    kernels::cuda::add(view(a.data(), {6}), view(b.data(), {6}), view(out.data(), {6}));
    FAIL() << "a host view was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[add] a is in host memory"), std::string::npos)
        << e.what();
  }
}

// Once the process selects the GPU (activate(), what `moecore` does for a CUDA device), the
// operations of kernels/ops.h, the ones the model calls, run views in device memory on the CUDA
// backend and host views on the CPU backend, in one process; the two agree on an op whose rule is
// exact in fp32 on both (SwiGLU's: one expf per element, both backends evaluating it in fp32, so
// within kernel_harness.h's elementwise bound).
TEST(CudaBackend, KernelsOpsRunDeviceViewsOnTheGpuOnceSelected) {
  const std::string described = kernels::cuda::activate();
  EXPECT_EQ(described, kernels::cuda::describe(kernels::cuda::current_device_info()));
  ASSERT_EQ(kernels::device_backend(Device::kCuda), &kernels::cuda_backend());

  const int64_t rows = 37, hidden = 129;
  const std::vector<float> gu = random_values(static_cast<size_t>(rows * 2 * hidden), 3);
  std::vector<float> on_cpu(static_cast<size_t>(rows * hidden));
  kernels::swiglu_forward(view(gu.data(), {rows, 2 * hidden}), view(on_cpu.data(), {rows, hidden}));

  // The GPU's memory through core/device_memory.h: views made from its plain pointers carry the
  // device, so the same calls reach the CUDA backend.
  DeviceArray<float> gu_on_gpu(Device::kCuda, gu.size());
  DeviceArray<float> act_on_gpu(Device::kCuda, on_cpu.size());
  EXPECT_EQ(device_of(gu_on_gpu.data() + 7), Device::kCuda);
  EXPECT_EQ(device_of(gu.data()), Device::kCpu);
  copy_bytes(gu_on_gpu.data(), gu.data(), gu.size() * sizeof(float));
  kernels::swiglu_forward(view(gu_on_gpu.data(), {rows, 2 * hidden}),
                          view(act_on_gpu.data(), {rows, hidden}));
  std::vector<float> on_gpu(on_cpu.size(), -1.0f);
  copy_bytes(on_gpu.data(), act_on_gpu.data(), on_gpu.size() * sizeof(float));
  EXPECT_LE(kernel_harness::nmse(on_gpu, on_cpu), kernel_harness::nmse_bound(1));

  // Growing keeps the contents and zeroes the rest, as std::vector's resize does.
  act_on_gpu.resize(on_cpu.size() + 3);
  std::vector<float> grown(on_cpu.size() + 3, -1.0f);
  copy_bytes(grown.data(), act_on_gpu.data(), grown.size() * sizeof(float));
  EXPECT_TRUE(std::equal(on_gpu.begin(), on_gpu.end(), grown.begin()));
  EXPECT_EQ(grown.back(), 0.0f);

  // One host and one device view in one call: an error naming the operation, before any launch.
  try {
    kernels::swiglu_forward(view(gu_on_gpu.data(), {rows, 2 * hidden}),
                            view(on_cpu.data(), {rows, hidden}));
    FAIL() << "a call with views in host and device memory ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[swiglu_forward] its views are in cuda and in cpu"),
              std::string::npos)
        << e.what();
  }
}

// The same inputs give the same bits on every run: no atomics in the sums.
TEST(CudaBackend, ReductionsRepeatBitForBit) {
  const std::vector<float> values = random_values(1 << 20, 1);
  std::vector<double> sums(3, -1.0);
  for (double& sum : sums) {
    DeviceStaging s;
    kernels::cuda::sum_of_squares(s.in(view(values.data(), {1 << 20})), s.out(view(&sum, {1})));
    s.finish();
  }
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], sums[2]);
}

// Experts whose rows start at odd offsets of an odd width hand cuBLASLt operands aligned to 4
// bytes only (bf16: 2), with odd leading dimensions; the GEMM must still run (the heuristic is
// told the real alignment, and cuBLAS's general GEMM takes what cuBLASLt has no kernel for) and
// match one GEMM per expert on copies that start at an aligned address. The two may run
// different algorithms, so they agree to fp32 summation order: kernel_harness.h's bound for sums
// of `in` terms (the products are exact in fp32 in bf16, and alike on both sides in fp32).
TEST(CudaBackend, GroupedGemmOnUnalignedExpertRows) {
  const int64_t experts = 3, out = 24, in = 41;
  const std::vector<int64_t> offsets = {0, 5, 5, 12};
  const std::vector<float> x = random_values(static_cast<size_t>(12 * in), 2);
  const std::vector<float> w = random_values(static_cast<size_t>(experts * out * in), 3);
  for (const auto precision : {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kBf16}) {
    std::vector<float> y(static_cast<size_t>(12 * out), -1.0f);
    {
      DeviceStaging s;
      kernels::cuda::grouped_gemm_forward(
          s.in(view(x.data(), {12, in})),
          s.in(ConstTensorView(w.data(), {experts, out, in}, DType::kF32)),
          s.in(view(offsets.data(), {experts + 1})), s.out(view(y.data(), {12, out})), precision);
      s.finish();
    }
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t rows = offsets[static_cast<size_t>(e + 1)] - offsets[static_cast<size_t>(e)];
      if (rows == 0) continue;
      std::vector<float> xe(x.begin() + offsets[static_cast<size_t>(e)] * in,
                            x.begin() + offsets[static_cast<size_t>(e + 1)] * in);
      std::vector<float> we(w.begin() + e * out * in, w.begin() + (e + 1) * out * in);
      std::vector<float> ye(static_cast<size_t>(rows * out));
      DeviceStaging s;
      kernels::cuda::matmul(s.in(view(xe.data(), {rows, in})), false,
                            s.in(view(we.data(), {out, in})), true, 1.0f, 0.0f,
                            s.out(view(ye.data(), {rows, out})), precision);
      s.finish();
      const auto first = y.begin() + offsets[static_cast<size_t>(e)] * out;
      const std::vector<float> grouped(first, first + rows * out);
      EXPECT_LE(kernel_harness::nmse(grouped, ye), kernel_harness::nmse_bound(in))
          << "expert " << e;
    }
  }
}

// The device-offset kernels' cases: empty experts, an expert of one row, row counts and widths
// that are not multiples of the 128 x 128 tile or of 16, and capacity rows past the last offset.
// Widths of a multiple of 8 take the kernels' 16-byte loads, the others one value at a time; the
// second case's experts and widths cross the tiles' edges and leave a tile 8 columns wide.
struct DeviceOffsetCase {
  int64_t experts, out, in, capacity;
  std::vector<int64_t> offsets;
};
const std::vector<DeviceOffsetCase> kDeviceOffsetCases = {
    {5, 70, 100, 200, {0, 0, 1, 66, 66, 150}}, {5, 136, 264, 400, {0, 0, 1, 130, 130, 390}}};

// The one-launch grouped GEMM reading its offsets from device memory against the operation (one
// cuBLASLt GEMM per expert, offsets on the host), both on the same bf16 operands, on
// kDeviceOffsetCases; capacity rows past the last offset must stay untouched. Both sum exact bf16
// products in fp32 in different orders: kernel_harness.h's bound for sums of `in` terms.
TEST(CudaBackend, GroupedGemmWithDeviceOffsetsMatchesTheOperation) {
  for (const auto& [experts, out, in, capacity, offsets] : kDeviceOffsetCases) {
    SCOPED_TRACE("out=" + std::to_string(out) + " in=" + std::to_string(in));
    const std::vector<float> x = random_values(static_cast<size_t>(capacity * in), 4);
    const std::vector<float> w = random_values(static_cast<size_t>(experts * out * in), 5);
    const int64_t rows = offsets.back();

    std::vector<float> expected(static_cast<size_t>(rows * out));
    {
      DeviceStaging s;
      kernels::cuda::grouped_gemm_forward(
          s.in(view(x.data(), {rows, in})),
          s.in(ConstTensorView(w.data(), {experts, out, in}, DType::kF32)),
          s.in(view(offsets.data(), {experts + 1})), s.out(view(expected.data(), {rows, out})),
          kernels::MatmulPrecision::kBf16);
      s.finish();
    }

    constexpr float kUntouched = 12345.0f;
    std::vector<float> got(static_cast<size_t>(capacity * out), kUntouched);
    {
      DeviceStaging s;
      const ConstTensorView xd = s.in(view(x.data(), {capacity, in}));
      const ConstTensorView wd = s.in(ConstTensorView(w.data(), {experts * out * in}, DType::kF32));
      std::vector<uint16_t> x16_host(x.size()), w16_host(w.size());
      const TensorView x16 = s.out(TensorView(x16_host.data(), {capacity, in}, DType::kBf16));
      const TensorView w16 = s.out(TensorView(w16_host.data(), {experts * out * in}, DType::kBf16));
      kernels::cuda::to_bf16(xd, x16);
      kernels::cuda::to_bf16(wd, w16);
      // The offsets as the routing would leave them: in device memory (no int64 dtype for a view).
      const DeviceVector<int64_t> offsets_device(offsets);
      const TensorView y = s.out(view(got.data(), {capacity, out}));
      kernels::cuda::launch_grouped_gemm_bf16_device_offsets(
          static_cast<const uint16_t*>(x16.raw()), static_cast<const uint16_t*>(w16.raw()),
          offsets_device.data(), experts, capacity, out, in, static_cast<float*>(y.raw()),
          kernels::cuda::stream());
      MOE_CUDA_CHECK(cudaGetLastError());
      s.finish();
    }
    const std::vector<float> got_rows(got.begin(), got.begin() + rows * out);
    EXPECT_LE(kernel_harness::nmse(got_rows, expected), kernel_harness::nmse_bound(in));
    for (int64_t i = rows * out; i < capacity * out; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], kUntouched)
          << "row " << i / out << " past the offsets";
  }
}

// The same kernels' backward passes, which a captured step runs: the input gradient dx[rows of e]
// = dy[rows of e] . w[e] and the weight gradient dw[e] += dy[rows of e]^T . x[rows of e], against
// plain loops over the same bf16 values in double, on kDeviceOffsetCases; capacity rows past the
// last offset stay untouched, an expert without rows keeps its gradient.
TEST(CudaBackend, GroupedGemmBackwardWithDeviceOffsetsMatchesPlainLoops) {
  for (const auto& [experts, out, in, capacity, offsets] : kDeviceOffsetCases) {
    SCOPED_TRACE("out=" + std::to_string(out) + " in=" + std::to_string(in));
    const int64_t rows = offsets.back();
    const auto bf16_values = [](std::vector<float> v) {
      for (float& x : v) x = bf16_to_float(float_to_bf16(x));
      return v;
    };
    const std::vector<float> x = bf16_values(random_values(static_cast<size_t>(capacity * in), 6));
    const std::vector<float> dy =
        bf16_values(random_values(static_cast<size_t>(capacity * out), 7));
    const std::vector<float> w =
        bf16_values(random_values(static_cast<size_t>(experts * out * in), 8));
    const std::vector<float> dw_before = random_values(static_cast<size_t>(experts * out * in), 9);

    std::vector<float> dx_expected(static_cast<size_t>(rows * in));
    std::vector<float> dw_added_expected(w.size(), 0.0f);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e) + 1];
           ++r)
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0.0;
          for (int64_t o = 0; o < out; ++o)
            sum += double{dy[static_cast<size_t>(r * out + o)]} *
                   double{w[static_cast<size_t>((e * out + o) * in + i)]};
          dx_expected[static_cast<size_t>(r * in + i)] = static_cast<float>(sum);
        }
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0.0;
          for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e) + 1];
               ++r)
            sum += double{dy[static_cast<size_t>(r * out + o)]} *
                   double{x[static_cast<size_t>(r * in + i)]};
          dw_added_expected[static_cast<size_t>((e * out + o) * in + i)] = static_cast<float>(sum);
        }

    constexpr float kUntouched = 12345.0f;
    std::vector<float> dx(static_cast<size_t>(capacity * in), kUntouched);
    std::vector<float> dw = dw_before;
    {
      DeviceStaging s;
      const auto on_gpu_bf16 = [&](const std::vector<float>& v, std::vector<uint16_t>& bits) {
        bits.resize(v.size());
        const TensorView b =
            s.out(TensorView(bits.data(), {static_cast<int64_t>(v.size())}, DType::kBf16));
        kernels::cuda::to_bf16(s.in(view(v.data(), {static_cast<int64_t>(v.size())})), b);
        return static_cast<const uint16_t*>(b.raw());
      };
      std::vector<uint16_t> x16, dy16, w16;
      const uint16_t* xd = on_gpu_bf16(x, x16);
      const uint16_t* dyd = on_gpu_bf16(dy, dy16);
      const uint16_t* wd = on_gpu_bf16(w, w16);
      const DeviceVector<int64_t> offsets_device(offsets);
      const TensorView dx_d = s.out(view(dx.data(), {capacity, in}));
      const TensorView dw_d = s.out(view(dw.data(), {experts, out, in}));
      kernels::cuda::launch_grouped_gemm_bf16_device_offsets_input_grad(
          dyd, wd, offsets_device.data(), experts, capacity, out, in,
          static_cast<float*>(dx_d.raw()), kernels::cuda::stream());
      MOE_CUDA_CHECK(cudaGetLastError());
      kernels::cuda::launch_grouped_gemm_bf16_device_offsets_weight_grad(
          dyd, xd, offsets_device.data(), experts, out, in, static_cast<float*>(dw_d.raw()),
          kernels::cuda::stream());
      MOE_CUDA_CHECK(cudaGetLastError());
      s.finish();
    }
    const std::vector<float> dx_rows(dx.begin(), dx.begin() + rows * in);
    EXPECT_LE(kernel_harness::nmse(dx_rows, dx_expected), kernel_harness::nmse_bound(out));
    for (int64_t i = rows * in; i < capacity * in; ++i)
      ASSERT_EQ(dx[static_cast<size_t>(i)], kUntouched) << "row " << i / in << " past the offsets";
    // Each expert's gradient on its own, as added to what it held: a wrong tile of one expert must
    // not hide in the others; an expert without rows keeps its gradient bit for bit.
    for (int64_t e = 0; e < experts; ++e) {
      const auto first = static_cast<size_t>(e * out * in),
                 last = first + static_cast<size_t>(out * in);
      std::vector<float> added(last - first), want(last - first);
      for (size_t i = first; i < last; ++i) {
        added[i - first] = dw[i] - dw_before[i];
        want[i - first] = dw_added_expected[i];
      }
      if (offsets[static_cast<size_t>(e)] == offsets[static_cast<size_t>(e) + 1]) {
        for (size_t i = first; i < last; ++i) ASSERT_EQ(dw[i], dw_before[i]) << "expert " << e;
      } else {
        EXPECT_LE(kernel_harness::nmse(added, want), kernel_harness::nmse_bound(capacity))
            << "expert " << e;
      }
    }
  }
}

// MOECORE_CUDA_SYNC_EACH_OP (runtime.h's sync_each_op), as scripts/gpu_check.sh reruns a test that
// faulted: an operation waits for its work outside a capture and leaves a capture alone (a wait
// there would break it: end_capture would throw), where the graph's replay waits instead; the
// results are the asynchronous backend's.
TEST(CudaBackend, SyncEachOpWaitsOutsideACaptureAndLeavesTheCaptureAlone) {
  const bool before = kernels::cuda::sync_each_op();
  struct Restore {
    bool enabled;
    ~Restore() { kernels::cuda::set_sync_each_op(enabled); }
  } restore{before};
  kernels::cuda::set_sync_each_op(true);
  const std::vector<float> values = random_values(1000, 5);
  const auto n = static_cast<int64_t>(values.size());
  const DeviceVector<float> x(values), doubled(values), scaled(values);
  const auto on_device = [n](const DeviceVector<float>& v) {
    return TensorView(v.data(), {n}, DType::kF32, Device::kCuda);
  };
  kernels::cuda::scale(on_device(x), 2.0f, on_device(doubled));
  DeviceGraphs& graphs = kernels::cuda::cuda_graphs();
  graphs.begin_capture();
  try {
    kernels::cuda::scale(on_device(doubled), 1.5f, on_device(scaled));
  } catch (...) {
    graphs.abandon_capture();
    throw;
  }
  const std::unique_ptr<DeviceGraph> graph = graphs.end_capture();
  graph->replay();
  const std::vector<float> got = scaled.to_host();
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(got[i], values[i] * 2.0f * 1.5f) << "element " << i;
}

}  // namespace
}  // namespace moecore::cuda_test
