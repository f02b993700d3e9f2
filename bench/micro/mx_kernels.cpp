// Micro-benchmark of the MX kernels on the CPU (Google Benchmark), at one expert-sized shape of the
// default model (configs/default.toml: d = 256, moe_intermediate_size = 512, 8 experts; the fused
// gate/up projection, out = 2 x 512 = 1024, with 512 routed rows per expert):
//   - mx_quantize and mx_dequantize of the routed activations [4096, 256] (bytes/s counts the fp32
//     side) and mx_quantize_transposed of the expert weights [8, 1024, 256] (the per-step weight
//     cache of the input gradient);
//   - mx_grouped_gemm_forward against grouped_gemm_forward in bf16 and in fp32 on the same shape.
// Why the MX GEMM gains nothing here: no x86 CPU multiplies FP8; the exact CPU MX GEMM decodes the
// codes to fp32 and runs fp32 FMAs in SIMD lanes in a fixed order (kernels/cpu/mx_gemm.h), so it
// is bounded by the fp32 FMA peak, while bf16 reaches AMX / AVX512-BF16 where the CPU has them; and
// quantising adds a pass over the activations that a GPU fuses into neighbouring kernels.
//
//   cmake --build --preset release --target moecore_bench_mx
//   OMP_NUM_THREADS=2 build/bin/moecore_bench_mx --benchmark_repetitions=5
//   (add --benchmark_report_aggregates_only=true for the medians alone)
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace moecore {
namespace {

constexpr int64_t kExperts = 8, kRowsPerExpert = 512, kIn = 256, kOut = 1024;
constexpr int64_t kRows = kExperts * kRowsPerExpert;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

std::vector<int64_t> expert_offsets() {
  std::vector<int64_t> offsets(kExperts + 1);
  for (int64_t e = 0; e <= kExperts; ++e) offsets[static_cast<size_t>(e)] = e * kRowsPerExpert;
  return offsets;
}

// An MX tensor [.., cols] of e4m3 codes and its scales.
struct MxTensor {
  std::vector<uint8_t> codes, scales;
  explicit MxTensor(int64_t n)
      : codes(static_cast<size_t>(n)), scales(static_cast<size_t>(n / mx::kMxBlock)) {}
};

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_MxQuantizeActivations(benchmark::State& state) {
  const std::vector<float> x = random_values(kRows * kIn, 1);
  MxTensor q(kRows * kIn);
  for (auto _ : state) {
    kernels::mx_quantize(view(x.data(), {kRows, kIn}), mx::ScaleMode::kRceil,
                         TensorView(q.codes.data(), {kRows, kIn}, DType::kE4m3),
                         TensorView(q.scales.data(), {kRows, kIn / mx::kMxBlock}, DType::kE8m0));
    benchmark::DoNotOptimize(q.codes.data());
  }
  state.SetBytesProcessed(state.iterations() * kRows * kIn * 4);
}

void BM_MxDequantizeActivations(benchmark::State& state) {
  const std::vector<float> x = random_values(kRows * kIn, 1);
  MxTensor q(kRows * kIn);
  const TensorView codes(q.codes.data(), {kRows, kIn}, DType::kE4m3);
  const TensorView scales(q.scales.data(), {kRows, kIn / mx::kMxBlock}, DType::kE8m0);
  kernels::mx_quantize(view(x.data(), {kRows, kIn}), mx::ScaleMode::kRceil, codes, scales);
  std::vector<float> back(x.size());
  for (auto _ : state) {
    kernels::mx_dequantize({codes, scales}, view(back.data(), {kRows, kIn}));
    benchmark::DoNotOptimize(back.data());
  }
  state.SetBytesProcessed(state.iterations() * kRows * kIn * 4);
}

void BM_MxQuantizeTransposedWeights(benchmark::State& state) {
  const std::vector<float> w = random_values(kExperts * kOut * kIn, 2);
  MxTensor q(kExperts * kOut * kIn);
  for (auto _ : state) {
    kernels::mx_quantize_transposed(
        ConstTensorView(w.data(), {kExperts, kOut, kIn}, DType::kF32), mx::ScaleMode::kRceil,
        TensorView(q.codes.data(), {kExperts, kIn, kOut}, DType::kE4m3),
        TensorView(q.scales.data(), {kExperts, kIn, kOut / mx::kMxBlock}, DType::kE8m0));
    benchmark::DoNotOptimize(q.codes.data());
  }
  state.SetBytesProcessed(state.iterations() * kExperts * kOut * kIn * 4);
}

void BM_MxGroupedGemmForward(benchmark::State& state) {
  const std::vector<float> x = random_values(kRows * kIn, 3);
  const std::vector<float> w = random_values(kExperts * kOut * kIn, 4);
  MxTensor qx(kRows * kIn), qw(kExperts * kOut * kIn);
  const TensorView x_codes(qx.codes.data(), {kRows, kIn}, DType::kE4m3);
  const TensorView x_scales(qx.scales.data(), {kRows, kIn / mx::kMxBlock}, DType::kE8m0);
  const TensorView w_codes(qw.codes.data(), {kExperts, kOut, kIn}, DType::kE4m3);
  const TensorView w_scales(qw.scales.data(), {kExperts, kOut, kIn / mx::kMxBlock}, DType::kE8m0);
  kernels::mx_quantize(view(x.data(), {kRows, kIn}), mx::ScaleMode::kRceil, x_codes, x_scales);
  kernels::mx_quantize(ConstTensorView(w.data(), {kExperts, kOut, kIn}, DType::kF32),
                       mx::ScaleMode::kRceil, w_codes, w_scales);
  const std::vector<int64_t> offsets = expert_offsets();
  std::vector<float> y(static_cast<size_t>(kRows * kOut));
  for (auto _ : state) {
    kernels::mx_grouped_gemm_forward({x_codes, x_scales}, {w_codes, w_scales},
                                     view(offsets.data(), {kExperts + 1}),
                                     view(y.data(), {kRows, kOut}));
    benchmark::DoNotOptimize(y.data());
  }
  set_flops(state, 2.0 * kRows * kOut * kIn);
}

void BM_GroupedGemmForward(benchmark::State& state, kernels::MatmulPrecision precision) {
  const std::vector<float> x = random_values(kRows * kIn, 3);
  const std::vector<float> w = random_values(kExperts * kOut * kIn, 4);
  const std::vector<int64_t> offsets = expert_offsets();
  std::vector<float> y(static_cast<size_t>(kRows * kOut));
  for (auto _ : state) {
    kernels::grouped_gemm_forward(
        view(x.data(), {kRows, kIn}), ConstTensorView(w.data(), {kExperts, kOut, kIn}, DType::kF32),
        view(offsets.data(), {kExperts + 1}), view(y.data(), {kRows, kOut}), precision);
    benchmark::DoNotOptimize(y.data());
  }
  set_flops(state, 2.0 * kRows * kOut * kIn);
}

BENCHMARK(BM_MxQuantizeActivations)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MxDequantizeActivations)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MxQuantizeTransposedWeights)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MxGroupedGemmForward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GroupedGemmForward, bf16, kernels::MatmulPrecision::kBf16)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GroupedGemmForward, fp32, kernels::MatmulPrecision::kFp32)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace moecore

BENCHMARK_MAIN();
