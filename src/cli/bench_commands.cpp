#include "cli/bench_commands.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/bf16.h"
#include "core/check.h"
#include "core/host_memory.h"
#include "core/mx_types.h"
#include "dist/communicator.h"
#include "dist/mpi/mpi_runtime.h"
#include "kernels/cpu/mx_gemm.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model/flop_count.h"
#include "model/params.h"
#include "plan/plan.h"
#include "train/run_config.h"

namespace moecore::cli {

namespace {

// A benchmark's buffers beyond the memory this process may use are refused in one line before
// they are allocated (the kernel's OOM killer would end the process without a word).
void require_buffers_fit(double bytes, const std::string& what) {
  const double memory = host_memory_limit_bytes();
  MOE_CHECK(memory <= 0.0 || bytes <= memory,
            "[bench] {} needs {:.1f} GiB of buffers, more than the {:.1f} GiB of memory this "
            "process may use: ask for smaller sizes",
            what, bytes / 1073741824.0, memory / 1073741824.0);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

}  // namespace

void run_bench_gemm(const BenchGemmArgs& args) {
  MOE_CHECK(args.m > 0 && args.n > 0 && args.k > 0,
            "[bench] gemm sizes must be positive (m={} n={} k={})", args.m, args.n, args.k);
  MOE_CHECK(args.repeats > 0, "[bench] --repeats={} must be positive", args.repeats);
  MOE_CHECK(args.min_seconds > 0.0, "[bench] --min-seconds={} must be positive", args.min_seconds);
  MOE_CHECK(args.threads >= 0, "[bench] --threads={} must be >= 0", args.threads);
  MOE_CHECK(args.precision == "fp32" || args.precision == "bf16" || args.precision == "mxfp8",
            "[bench] --precision={} (expected fp32, bf16 or mxfp8)", args.precision);
  const bool mxfp8 = args.precision == "mxfp8";
  if (mxfp8) mx::check_mx_contraction("bench gemm", args.k);
  // kernels::gemm as the model calls it: in bf16, the operands are rounded to bf16 inside each
  // call (oneDNN's native bf16 matmul where the CPU has it, else the emulated path).
  const kernels::MatmulPrecision precision =
      args.precision == "bf16" ? kernels::MatmulPrecision::kBf16 : kernels::MatmulPrecision::kFp32;
  if (args.threads > 0) omp_set_num_threads(static_cast<int>(args.threads));

  // The buffers below, counted before any is allocated (sizes up to 2^20 ask for terabytes, which
  // the kernel answers by killing the process): fp32 A, B and C, and for mxfp8 the E4M3 codes and
  // E8M0 scales of A, B and the quantiser benchmark's output.
  const auto elements = [](int64_t rows, int64_t cols) {
    return static_cast<double>(rows) * static_cast<double>(cols);
  };
  const double fp32_elements =
      elements(args.m, args.k) + elements(args.k, args.n) + elements(args.m, args.n);
  const double mx_elements = elements(args.m, args.k) + elements(args.n, args.k) +
                             elements(std::max(args.m, args.n), args.k);
  const double bytes =
      4.0 * fp32_elements +
      (args.precision == "bf16" ? 2.0 * (elements(args.m, args.k) + elements(args.k, args.n))
                                : 0.0) +
      (mxfp8 ? mx_elements * (1.0 + 1.0 / static_cast<double>(mx::kMxBlock)) : 0.0);
  require_buffers_fit(
      bytes, fmt::format("gemm m={} n={} k={} ({})", args.m, args.n, args.k, args.precision));

  const auto size = [](int64_t rows, int64_t cols) { return static_cast<size_t>(rows * cols); };
  std::vector<float> a(size(args.m, args.k)), b(size(args.k, args.n)), c(size(args.m, args.n));
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : a) v = uniform(rng);
  for (float& v : b) v = uniform(rng);
  // mxfp8: A [m, k] and B^T [n, k] (b's values read as [n, k]) quantised along k once, E4M3 with
  // rceil scales, as cached weights and activations would be; a call is the MX GEMM alone.
  std::vector<uint8_t> a_codes, a_scales, b_codes, b_scales;
  if (mxfp8) {
    const auto quantize = [](int64_t rows, int64_t k, const std::vector<float>& x,
                             std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
      codes.resize(static_cast<size_t>(rows * k));
      scales.resize(static_cast<size_t>(rows * k / mx::kMxBlock));
      mx::quantize(mx::ElemType::kE4M3, mx::ScaleMode::kRceil, rows, k, x.data(), k, codes.data(),
                   scales.data());
    };
    quantize(args.m, args.k, a, a_codes, a_scales);
    quantize(args.n, args.k, b, b_codes, b_scales);
  }
  // bf16: both operands rounded once, as the model's weight copies and activations are, so that
  // a call is the GEMM alone on the native path (kernels::gemm would round both on every call,
  // which the model's GEMMs do not); the emulated path widens them in every call, as the model's
  // emulated GEMMs round theirs.
  const bool bf16_operands = args.precision == "bf16";
  std::vector<uint16_t> a16, b16;
  if (bf16_operands) {
    a16.resize(a.size());
    b16.resize(b.size());
    std::transform(a.begin(), a.end(), a16.begin(), float_to_bf16);
    std::transform(b.begin(), b.end(), b16.begin(), float_to_bf16);
  }
  const auto call = [&] {
    if (bf16_operands) {
      kernels::gemm_bf16_ab16(kernels::bf16_gemm_path(), false, false, args.m, args.n, args.k, 1.0f,
                              a16.data(), b16.data(), 0.0f, c.data(), args.n);
    } else if (mxfp8) {
      kernels::cpu::mx_gemm(
          args.m, args.n, args.k, {mx::ElemType::kE4M3, a_codes.data(), a_scales.data()},
          {mx::ElemType::kE4M3, b_codes.data(), b_scales.data()}, c.data(), args.n);
    } else {
      kernels::gemm(precision, false, false, args.m, args.n, args.k, 1.0f, a.data(), args.k,
                    b.data(), args.n, 0.0f, c.data(), args.n);
    }
  };
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // Warm-up (oneDNN's kernel generation, first touch), then calls per repeat from its timing.
  call();
  const Clock::time_point probe = Clock::now();
  call();
  const double one_call = std::max(seconds_since(probe), 1e-7);
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(args.min_seconds / one_call));

  const double flops = 2.0 * static_cast<double>(args.m) * static_cast<double>(args.n) *
                       static_cast<double>(args.k) * static_cast<double>(calls);
  std::vector<double> rates;
  for (int64_t r = 0; r < args.repeats; ++r) {
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < calls; ++i) call();
    rates.push_back(flops / seconds_since(start));
  }
  const auto [slowest, fastest] = std::minmax_element(rates.begin(), rates.end());
  const bool emulated =
      args.precision == "bf16" && kernels::bf16_gemm_path() == kernels::Bf16GemmPath::kEmulated;
  nlohmann::json out = {{"precision", args.precision},
                        {"emulated", emulated},
                        {"m", args.m},
                        {"n", args.n},
                        {"k", args.k},
                        {"threads", omp_get_max_threads()},
                        {"calls_per_repeat", calls},
                        {"flops_per_s", rates},
                        {"flops_per_s_median", median_of(rates)},
                        {"flops_per_s_min", *slowest},
                        {"flops_per_s_max", *fastest}};
  if (mxfp8) {
    // The quantisers the model runs around its MX GEMMs (kernels::mx_quantize and
    // mx_quantize_transposed): A [m, k] as an activation is quantised before every GEMM, B as a
    // weight [n, k] into its two cached orientations once per optimizer step
    // (model/mx_weight_caches.h; only when n is whole blocks too, as a cached weight must be).
    // Values per second of each, medians of the repeats; `moecore plan` prices the quantisation
    // passes with them.
    std::vector<uint8_t> codes(size(std::max(args.m, args.n), args.k)),
        scales(size(std::max(args.m, args.n), args.k) / mx::kMxBlock);
    const auto e4m3 = [](uint8_t* p, std::initializer_list<int64_t> shape) {
      return TensorView(p, shape, DType::kE4m3);
    };
    const auto e8m0 = [](uint8_t* p, std::initializer_list<int64_t> shape) {
      return TensorView(p, shape, DType::kE8m0);
    };
    const auto values_per_s = [&](double values, const std::function<void()>& op) {
      op();  // first touch
      std::vector<double> v;
      for (int64_t r = 0; r < std::max<int64_t>(args.repeats, 1); ++r) {
        const Clock::time_point start = Clock::now();
        op();
        v.push_back(values / std::max(seconds_since(start), 1e-9));
      }
      return median_of(v);
    };
    const auto mode = mx::ScaleMode::kRceil;
    out["mx_quantize_values_per_s"] = values_per_s(static_cast<double>(args.m * args.k), [&] {
      kernels::mx_quantize(view(a.data(), {args.m, args.k}), mode,
                           e4m3(codes.data(), {args.m, args.k}),
                           e8m0(scales.data(), {args.m, args.k / mx::kMxBlock}));
    });
    if (args.n % mx::kMxBlock == 0)
      out["mx_weight_refresh_values_per_s"] =
          values_per_s(static_cast<double>(args.n * args.k), [&] {
            const ConstTensorView w = view(b.data(), {args.n, args.k});
            kernels::mx_quantize(w, mode, e4m3(codes.data(), {args.n, args.k}),
                                 e8m0(scales.data(), {args.n, args.k / mx::kMxBlock}));
            kernels::mx_quantize_transposed(w, mode, e4m3(codes.data(), {args.k, args.n}),
                                            e8m0(scales.data(), {args.k, args.n / mx::kMxBlock}));
          });
  }
  fmt::print("{}\n", out.dump());
}

void run_bench_stream(int64_t megabytes, int64_t repeats, int64_t threads) {
  MOE_CHECK(megabytes > 0 && repeats > 0 && threads >= 0,
            "[bench] stream needs positive --megabytes and --repeats (got {} and {})", megabytes,
            repeats);
  require_buffers_fit(3.0 * static_cast<double>(megabytes) * 1048576.0,
                      fmt::format("stream --megabytes {} (three arrays)", megabytes));
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  const auto n = static_cast<int64_t>(megabytes) * 1024 * 1024 / 4;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n), 1.0f),
      c(static_cast<size_t>(n), 2.0f);
  const float scale = 3.0f;
  const auto triad = [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] + scale * c[static_cast<size_t>(i)];
  };
  triad();  // first touch
  std::vector<double> rates;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    triad();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(16.0 * static_cast<double>(n) / s);  // with a's write-allocate (see .h)
  }
  const nlohmann::json out = {{"megabytes", megabytes},
                              {"threads", omp_get_max_threads()},
                              {"bytes_per_s", rates},
                              {"bytes_per_s_median", median_of(rates)},
                              {"check", a[static_cast<size_t>(n / 2)]}};
  fmt::print("{}\n", out.dump());
}

void run_bench_pingpong(int64_t max_megabytes, int64_t repeats) {
  const std::unique_ptr<dist::Communicator> world_group = dist::mpi_world();
  const dist::Communicator& world = *world_group;
  MOE_CHECK(world.size() >= 2, "[bench] pingpong needs 2 ranks (mpirun -np 2), got {}",
            world.size());
  MOE_CHECK(max_megabytes > 0 && repeats > 0,
            "[bench] pingpong needs positive --max-megabytes and --repeats (got {} and {})",
            max_megabytes, repeats);
  // Every rank checks its own buffer (ranks sharing a machine share its memory too).
  require_buffers_fit(static_cast<double>(max_megabytes) * 1048576.0,
                      fmt::format("pingpong --max-megabytes {}", max_megabytes));
  const int rank = world.rank();
  const int64_t max_floats = max_megabytes * 1024 * 1024 / 4;
  std::vector<float> buffer(static_cast<size_t>(max_floats), 1.0f);
  nlohmann::json sizes = nlohmann::json::array();
  for (int64_t count = 1; count <= max_floats; count *= 16) {
    // One request at a time, so each leg completes before the next.
    const auto leg = [](dist::Request request) { dist::wait(request); };
    const auto exchange = [&] {
      if (rank == 0) {
        leg(world.isend(buffer.data(), count, 1, 0));
        leg(world.irecv(buffer.data(), count, 1, 1));
      } else if (rank == 1) {
        leg(world.irecv(buffer.data(), count, 0, 0));
        leg(world.isend(buffer.data(), count, 0, 1));
      }
    };
    exchange();  // warm-up: connection set-up, first touch
    world.barrier();
    std::vector<double> one_way;
    for (int64_t r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      exchange();
      one_way.push_back(
          0.5 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double seconds = median_of(one_way);
    sizes.push_back({{"bytes", 4 * count},
                     {"one_way_seconds_median", seconds},
                     {"bytes_per_s", 4.0 * static_cast<double>(count) / seconds}});
  }
  if (rank == 0)
    fmt::print("{}\n", nlohmann::json{{"ranks", world.size()}, {"sizes", sizes}}.dump());
}

void run_bench_collectives(int64_t max_megabytes, int64_t repeats) {
  const std::unique_ptr<dist::Communicator> world_group = dist::mpi_world();
  const dist::Communicator& world = *world_group;
  MOE_CHECK(world.size() >= 2, "[bench] collectives needs at least 2 ranks (mpirun -np 2), got {}",
            world.size());
  MOE_CHECK(max_megabytes > 0 && repeats > 0,
            "[bench] collectives needs positive --max-megabytes and --repeats (got {} and {})",
            max_megabytes, repeats);
  const int64_t ranks = world.size();
  const double n = static_cast<double>(ranks);
  // Buffers that are multiples of the ranks, so that the reduce-scatter's slices are equal.
  const int64_t max_floats = max_megabytes * 1024 * 1024 / 4 / ranks * ranks;
  std::vector<float> buffer(static_cast<size_t>(max_floats), 1.0f),
      part(static_cast<size_t>(max_floats / ranks));
  const auto time = [&](const std::function<void()>& op) {
    op();  // warm-up: connection set-up, first touch
    std::vector<double> seconds;
    for (int64_t r = 0; r < repeats; ++r) {
      world.barrier();
      const auto start = std::chrono::steady_clock::now();
      op();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      world.allreduce_max(&s, 1);  // the collective ends when its slowest rank is done
      seconds.push_back(s);
    }
    return median_of(seconds);
  };
  nlohmann::json sizes = nlohmann::json::array();
  // 1 MiB, then x 4 up to the largest (which is always measured).
  for (int64_t mib = 1;; mib = std::min(mib * 4, max_megabytes)) {
    const int64_t floats = mib * 1024 * 1024 / 4 / ranks * ranks, slice = floats / ranks;
    const double bytes = 4.0 * static_cast<double>(floats);
    const double allreduce = time([&] {
      dist::Request request = world.iallreduce_sum(buffer.data(), floats);
      dist::wait(request);
    });
    const double reduce_scatter =
        time([&] { world.reduce_scatter_sum(buffer.data(), part.data(), slice); });
    const double allgather = time([&] { world.allgather(part.data(), buffer.data(), slice); });
    sizes.push_back({{"bytes", bytes},
                     {"allreduce_bus_bytes_per_s", 2.0 * (n - 1.0) / n * bytes / allreduce},
                     {"reduce_scatter_bus_bytes_per_s", (n - 1.0) / n * bytes / reduce_scatter},
                     {"allgather_bus_bytes_per_s", (n - 1.0) / n * bytes / allgather},
                     {"seconds_median",
                      {{"allreduce", allreduce},
                       {"reduce_scatter", reduce_scatter},
                       {"allgather", allgather}}}});
    if (mib == max_megabytes) break;
  }
  if (world.rank() == 0)
    fmt::print("{}\n", nlohmann::json{{"ranks", ranks}, {"sizes", sizes}}.dump());
}

void run_bench_flops(const std::string& config_path, const std::vector<std::string>& overrides) {
  const RunConfig config = load_run_config(config_path, overrides);
  const ModelConfig& mc = config.model;
  const FlopsPerToken f = flops_per_token(mc, config.train.seq_len);
  const ParamLayout layout = ParamLayout::build(mc);
  const double dense = static_cast<double>(layout.numel(ParamGroup::kDense));
  const double expert = static_cast<double>(layout.numel(ParamGroup::kExpert));
  const nlohmann::json out = {
      {"seq_len", config.train.seq_len},
      {"flops_per_token", plan::flops_json(f)},
      {"parameters",
       {{"total", dense + expert},
        {"dense", dense},
        {"expert", expert},
        // Touched by one token: the dense weights and k of the E experts of each MoE layer.
        {"active", dense + expert * static_cast<double>(mc.num_experts_per_tok) /
                               static_cast<double>(mc.num_experts)}}}};
  fmt::print("{}\n", out.dump());
}

}  // namespace moecore::cli
