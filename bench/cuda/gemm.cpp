// The CUDA backend's GEMMs on one GPU (issue 15, items 5 and 6): the ceiling and where the
// engine's GEMM ops stand against it.
//   peak       cuBLASLt bf16 8192^3 on bf16 operands (kernels/cuda/gemm_lt.h): the "measured cuBLAS
//              bf16 peak" that MFU is reported against, measured in the same run;
//   matmul     the matmul op in bf16 at a dense projection of a GPU-sized model (16384 tokens,
//              2048 -> 2048), f32 activations rounded to bf16 in the call, the weight's bf16 copy;
//   experts    the experts' gate/up GEMMs of one pass (the grouped GEMM op's forward, input and
//              weight gradients) in bf16 at 8, 32 and 128 experts with the active parameters
//              fixed by bench/gpu_peer.py's rule (bench/configs/gpu.toml: top-4 of experts of
//              width 512 at 16384 tokens, so 65536 routes: ~8192 rows per expert at 8 experts,
//              ~512 at 128, uneven as routing leaves them, the same FLOPs at every count), as one
//              cuBLASLt GEMM per expert after reading the offsets back and as the one-launch
//              kernels reading them on the device: how much the per-expert GEMMs lose as they
//              shrink (item 6: at most 5 % tokens/s lost from 8 to 128 experts), and which form a
//              step should take;
//   attention  flash attention's forward and backward (the ops, kernels/cuda/flash_attention*.cu)
//              at bench/configs/gpu.toml's shape (8 sequences of 2048 positions, 16 heads of 128,
//              causal), in bf16 on the tensor cores and in fp32 on the CUDA cores; FLOPs as MFU
//              counts them (model/flop_count.h: 12 x heads x head_dim per token and causal key,
//              forward 4, backward 8), so the rate is comparable with the peak though the kernels
//              compute the scores three times (the forward's two sweeps, the backward's two
//              kernels).
// Each case: 3 warm-up calls (the experts': at least one per draw of their rows), then the median
// of 20 timed calls (CUDA events on the backend's stream). Prints a markdown table, each row as its
// case ends; --json PATH also writes the figures, rewritten after each case ("complete": false
// until the last), so that a run stopped at the GPU check's limit keeps what it measured.
// --quick divides every size by 16 and times 1 call after 1 (the experts' too: two of their
// draws): a run of the code, not of the GPU (ctest CudaSim.GemmBench runs it so on the emulated
// GPU, where the full sizes would take hours).
//   scripts/gpu_bundle.sh && scripts/gpu_check.sh      (runs it after the op tests)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/cuda/device_selection.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace {

using moecore::ConstTensorView;
using moecore::Device;
using moecore::DType;
using moecore::TensorView;
using moecore::kernels::MatmulPrecision;
namespace cuda = moecore::kernels::cuda;

// How the cases run: the full sizes with 3 warm-up calls and 20 timed, the experts' warm-up
// seeing every draw of their rows; or (--quick) every size divided by 16 with 1 and 1.
struct RunShape {
  int64_t divisor = 1;
  int warmup = 3;
  int timed = 20;
  bool experts_warm_every_draw = true;
};

// Device memory for one case, filled with values in [-1, 1) (bf16 or f32): a pattern of
// kPatternElements values drawn on the host (seeded by the element count) and repeated on the
// device by copies that each double the filled part. Drawing every element on the host (2.7
// billion in all) took tens of seconds of the GPU check's minute before the first case was timed.
// The period is prime, so that no two rows of a power-of-two width hold the same values.
class DeviceBuffer {
 public:
  static constexpr int64_t kPatternElements = 65521;

  DeviceBuffer(int64_t elements, DType dtype) : dtype_(dtype) {
    const size_t element_bytes = moecore::dtype_size(dtype);
    const size_t bytes = static_cast<size_t>(elements) * element_bytes;
    MOE_CUDA_CHECK(cudaMalloc(&data_, bytes));
    std::vector<float> values(static_cast<size_t>(std::min(elements, kPatternElements)));
    std::mt19937 gen(static_cast<uint32_t>(elements));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : values) v = uniform(gen);
    std::vector<uint16_t> bf16_values;
    if (dtype == DType::kBf16)
      std::transform(values.begin(), values.end(), std::back_inserter(bf16_values),
                     moecore::float_to_bf16);
    const void* pattern = dtype == DType::kBf16 ? static_cast<const void*>(bf16_values.data())
                                                : static_cast<const void*>(values.data());
    // Every copy on the backend's stream (non-blocking: the legacy stream's copies would not be
    // ordered before its kernels).
    auto* const first = static_cast<char*>(data_);
    size_t filled = values.size() * element_bytes;
    MOE_CUDA_CHECK(cudaMemcpyAsync(first, pattern, filled, cudaMemcpyHostToDevice, cuda::stream()));
    while (filled < bytes) {
      const size_t copied = std::min(filled, bytes - filled);
      MOE_CUDA_CHECK(
          cudaMemcpyAsync(first + filled, first, copied, cudaMemcpyDeviceToDevice, cuda::stream()));
      filled += copied;
    }
    cuda::synchronize();  // the host pattern may go
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  TensorView view(std::initializer_list<int64_t> shape) const {
    return {data_, shape, dtype_, Device::kCuda};
  }

 private:
  void* data_ = nullptr;
  DType dtype_;
};

// The median milliseconds of one call of `run`.
double median_ms(const RunShape& shape, const std::function<void()>& run) {
  for (int i = 0; i < shape.warmup; ++i) run();
  cudaEvent_t start = nullptr, stop = nullptr;
  MOE_CUDA_CHECK(cudaEventCreate(&start));
  MOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < shape.timed; ++i) {
    MOE_CUDA_CHECK(cudaEventRecord(start, cuda::stream()));
    run();
    MOE_CUDA_CHECK(cudaEventRecord(stop, cuda::stream()));
    MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Result {
  std::string name;
  double flops;
  double ms;
  double tflops() const { return flops / (ms * 1e-3) / 1e12; }
};

// The results so far: each printed as a row of the table as it comes (flushed: the GPU check's
// log keeps it if the run is stopped), and the JSON rewritten whole (through a temporary file,
// renamed: a stop mid-write leaves the previous one).
class Results {
 public:
  Results(std::string device, std::string json_path)
      : device_(std::move(device)), json_path_(std::move(json_path)) {}

  void add(const Result& r) {
    results_.push_back(r);
    const double peak_tflops = results_.front().tflops();
    std::printf("| %s | %.3f | %.1f | %.1f %% |\n", r.name.c_str(), r.ms, r.tflops(),
                100.0 * r.tflops() / peak_tflops);
    std::fflush(stdout);
    write_json(false);
  }
  void finish() const { write_json(true); }

 private:
  void write_json(bool complete) const {
    if (json_path_.empty()) return;
    nlohmann::json cases = nlohmann::json::array();
    for (const Result& r : results_)
      cases.push_back({{"name", r.name}, {"ms", r.ms}, {"tflops", r.tflops()}});
    const std::string written = json_path_ + ".partial";
    {
      std::ofstream out(written);
      out << nlohmann::json{{"device", device_}, {"complete", complete}, {"cases", cases}}.dump(1)
          << "\n";
      MOE_CHECK(out.good(), "[bench] cannot write {}", written);
    }
    std::error_code renamed;
    std::filesystem::rename(written, json_path_, renamed);
    MOE_CHECK(!renamed, "[bench] cannot rename {} to {}: {}", written, json_path_,
              renamed.message());
  }

  std::string device_, json_path_;
  std::vector<Result> results_;
};

Result peak(const RunShape& shape) {
  const int64_t n = 8192 / shape.divisor;
  const DeviceBuffer a(n * n, DType::kBf16), b(n * n, DType::kBf16), c(n * n, DType::kF32);
  const double ms = median_ms(shape, [&] {
    cuda::gemm_lt("peak", false, true, n, n, n, 1.0f, a.data(), b.data(), CUDA_R_16BF, 0.0f,
                  static_cast<float*>(c.data()));
  });
  return {"peak: cuBLASLt bf16 " + std::to_string(n) + "^3 (bf16 operands)", 2.0 * n * n * n, ms};
}

Result dense_matmul(const RunShape& shape) {
  const int64_t tokens = 16384 / shape.divisor, in = 2048 / shape.divisor,
                out = 2048 / shape.divisor;
  const DeviceBuffer x(tokens * in, DType::kF32), w(out * in, DType::kBf16),
      y(tokens * out, DType::kF32);
  const double ms = median_ms(shape, [&] {
    cuda::matmul(x.view({tokens, in}), false, w.view({out, in}), true, 1.0f, 0.0f,
                 y.view({tokens, out}), MatmulPrecision::kBf16);
  });
  return {"matmul op bf16: " + std::to_string(tokens) + " x " + std::to_string(in) + " -> " +
              std::to_string(out),
          2.0 * tokens * in * out, ms};
}

// The experts' gate/up GEMMs of one pass at `count` experts: the grouped GEMM op's forward and
// backward (input and weight gradients) on bf16 operands, as the model calls them in bf16, with
// the row offsets in device memory, where routing writes them. The rows per expert differ (each
// route's expert drawn uniformly, as from a balanced router; kDraws draws taken in turn, every one
// seen in the warm-up), so the per-expert form pays what a training step pays: the offsets read
// back with a wait for the stream, then one cuBLASLt GEMM per expert and product, each of its
// shapes planned once. Timed as cuBLASLt GEMMs per expert and as one launch of the device-offset
// kernels (set_experts_in_one_launch): how much the per-expert GEMMs lose as they shrink (item 6:
// at most 5 % tokens/s lost from 8 to 128 experts), and which form a step should take
// (bench/gpu_peer.py --moecore-grouped-gemm auto). bench/configs/gpu.toml's shape: top-4 of
// experts of width 512 at 16384 tokens, so 65536 routes, ~8192 rows per expert at 8 experts and
// ~512 at 128, the same FLOPs at every count.
std::vector<Result> experts(int64_t count, const RunShape& shape) {
  constexpr int64_t kDraws = 4;
  const int64_t tokens = 16384 / shape.divisor, d = 2048 / shape.divisor, top_k = 4,
                width = 512 / shape.divisor;
  const int64_t rows = tokens * top_k, n = 2 * width;
  std::vector<int64_t> offsets(static_cast<size_t>(kDraws * (count + 1)), 0);
  std::mt19937_64 gen(static_cast<uint64_t>(count));
  std::uniform_int_distribution<int64_t> expert_of(0, count - 1);
  for (int64_t draw = 0; draw < kDraws; ++draw) {
    int64_t* draw_offsets = offsets.data() + draw * (count + 1);
    for (int64_t r = 0; r < rows; ++r) ++draw_offsets[expert_of(gen) + 1];
    for (int64_t e = 0; e < count; ++e) draw_offsets[e + 1] += draw_offsets[e];
  }
  const DeviceBuffer x(rows * d, DType::kBf16), w(count * n * d, DType::kBf16),
      dy(rows * n, DType::kBf16), y(rows * n, DType::kF32), dx(rows * d, DType::kF32),
      dw(count * n * d, DType::kF32);
  int64_t* device_offsets = nullptr;
  MOE_CUDA_CHECK(cudaMalloc(&device_offsets, offsets.size() * sizeof(int64_t)));
  MOE_CUDA_CHECK(cudaMemcpyAsync(device_offsets, offsets.data(), offsets.size() * sizeof(int64_t),
                                 cudaMemcpyHostToDevice, cuda::stream()));
  cuda::synchronize();
  RunShape experts_run = shape;
  if (shape.experts_warm_every_draw)
    experts_run.warmup = static_cast<int>(std::max<int64_t>(kDraws, shape.warmup));
  const auto time_pass = [&](bool one_launch) {
    cuda::set_experts_in_one_launch(one_launch);
    int64_t call = 0;
    const double ms = median_ms(experts_run, [&] {
      const ConstTensorView draw_offsets(device_offsets + (call++ % kDraws) * (count + 1),
                                         {count + 1}, DType::kI64, Device::kCuda);
      cuda::grouped_gemm_forward(x.view({rows, d}), w.view({count, n, d}), draw_offsets,
                                 y.view({rows, n}), MatmulPrecision::kBf16);
      cuda::grouped_gemm_backward(dy.view({rows, n}), x.view({rows, d}), w.view({count, n, d}),
                                  draw_offsets, dx.view({rows, d}), dw.view({count, n, d}),
                                  MatmulPrecision::kBf16);
    });
    cuda::set_experts_in_one_launch(false);
    return ms;
  };
  const double per_expert_ms = time_pass(false);
  const double one_launch_ms = time_pass(true);
  MOE_CUDA_CHECK(cudaFree(device_offsets));
  const std::string what = std::to_string(count) + " experts, top-" + std::to_string(top_k) +
                           ", gate/up " + std::to_string(d) + " -> " + std::to_string(n) +
                           ", forward and backward, uneven rows";
  // The forward's, the input gradient's and the weight gradient's products.
  const double flops = 3.0 * 2.0 * static_cast<double>(rows) * d * static_cast<double>(n);
  return {{"experts, cuBLASLt per expert (offsets read back): " + what, flops, per_expert_ms},
          {"experts, one launch, device offsets (WMMA): " + what, flops, one_launch_ms}};
}

// One training step's attention core: flash_attention_forward then _backward (causal, no
// documents) at `precision`; --quick keeps the head dimension (the kernels are chosen by it).
Result attention(MatmulPrecision precision, const RunShape& shape) {
  const int64_t batch = 8 / std::min<int64_t>(shape.divisor, 8), seq = 2048 / shape.divisor,
                heads = 16 / std::min<int64_t>(shape.divisor, 16), hd = 128;
  const int64_t rows = batch * seq * heads * hd;
  const DeviceBuffer q(rows, DType::kF32), k(rows, DType::kF32), v(rows, DType::kF32),
      out(rows, DType::kF32), dout(rows, DType::kF32), dq(rows, DType::kF32), dk(rows, DType::kF32),
      dv(rows, DType::kF32), lse(batch * heads * seq, DType::kF32);
  const auto shape4 = [&](const DeviceBuffer& b) { return b.view({batch, seq, heads, hd}); };
  const double ms = median_ms(shape, [&] {
    cuda::flash_attention_forward(shape4(q), shape4(k), shape4(v), shape4(out),
                                  lse.view({batch, heads, seq}), ConstTensorView{}, precision);
    cuda::flash_attention_backward(shape4(dout), shape4(q), shape4(k), shape4(v), shape4(out),
                                   lse.view({batch, heads, seq}), ConstTensorView{}, shape4(dq),
                                   shape4(dk), shape4(dv), precision);
  });
  const double causal_pairs = static_cast<double>(seq) * static_cast<double>(seq + 1) / 2.0;
  const bool bf16 = precision == MatmulPrecision::kBf16;
  return {std::string("attention fwd+bwd ") + (bf16 ? "bf16, tensor cores" : "fp32, CUDA cores") +
              ": " + std::to_string(batch) + " x " + std::to_string(seq) + ", " +
              std::to_string(heads) + " heads of " + std::to_string(hd),
          12.0 * static_cast<double>(batch * heads * hd) * causal_pairs, ms};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  RunShape shape;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::string(argv[i]) == "--quick") {
      shape = {16, 1, 1, /*experts_warm_every_draw=*/false};
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  try {
    const std::string why = cuda::unavailable_reason();
    if (!why.empty()) {
      std::printf("moecore_bench_cuda_gemm: no usable CUDA device (%s)\n", why.c_str());
      return 77;
    }
    const std::string device = cuda::describe(cuda::current_device_info());
    // As training does (activate()): the pool keeps freed memory, or the matmul op's scratch would
    // be mapped again inside every timed call.
    cuda::keep_freed_device_memory();
    std::printf("GEMMs on %s, median of %d calls after %d warm-up\n\n", device.c_str(), shape.timed,
                shape.warmup);
    std::printf("| case | ms | TFLOP/s | of peak |\n|---|---:|---:|---:|\n");
    std::fflush(stdout);
    Results results(device, json_path);
    results.add(peak(shape));  // first: the rows after it are read against it
    results.add(dense_matmul(shape));
    for (const int64_t count : {8, 32, 128})
      for (const Result& r : experts(count, shape)) results.add(r);
    for (const MatmulPrecision precision : {MatmulPrecision::kBf16, MatmulPrecision::kFp32})
      results.add(attention(precision, shape));
    results.finish();
  } catch (const moecore::Error& e) {
    std::fprintf(stderr, "moecore_bench_cuda_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
