// Does pre-packing the bf16 weight copies for oneDNN pay on this CPU? (issue 14, item 4: "weight
// copies made once per optimizer step, and pre-packed where oneDNN gains from it").
//
// The bf16 GEMMs (kernels/cpu/gemm_bf16.cpp) run one oneDNN matmul primitive per (transposes, N,
// ldc, alpha, beta) with a runtime M and K, on B in its stored (plain) layout; on AMX, since
// c6492aa, the row-major calls run most of their rows through fixed-shape primitives on the plain
// B (FixedPlain below). Pre-packing means a primitive whose weights descriptor is
// `format_tag::any`, so that oneDNN picks its blocked layout, and the weight reordered into that
// layout once per optimizer step; oneDNN 2.6 allows `any` only for fully known shapes, so such a
// primitive is also fixed in M (one per weight and row count).
// This benchmark times, at the default model's GEMMs (configs/default.toml: 16 x 128 = 2048 token
// rows, d 256, q/k/v 768, experts 512 wide, vocabulary 4096; experts see ~512 rows each), the
// forward (x . W^T) and input-gradient (dy . W) orientations of:
//   Current     runtime-M primitive, plain B (what the engine runs without AMX);
//   FixedPlain  fixed-shape primitive, plain B (oneDNN packs B inside every call);
//   FixedPacked fixed-shape primitive, B reordered once outside the timed loop (pre-packed).
// The reorder itself is timed apart (Reorder): it is paid once per optimizer step per weight.
//
//   cmake --build --preset release --target moecore_bench_prepack
//   OMP_NUM_THREADS=2 build/bin/moecore_bench_prepack --benchmark_repetitions=5
//   (add --benchmark_report_aggregates_only=true for the medians alone)
// Results and the decision (no gain from pre-packing here): bench/results/bf16_prepack.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> exponent(120, 130);  // values of magnitude 2^-7 .. 2^3
  std::uniform_int_distribution<int> low(0, 255);
  std::vector<uint16_t> x(n);
  for (uint16_t& v : x)
    v = static_cast<uint16_t>((low(gen) & 1) << 15 | exponent(gen) << 7 | (low(gen) & 0x7f));
  return x;
}

// The operands of one GEMM C[M, N] = A[M, K] . B[K, N]; trans_b: B stored as [N, K] (a weight
// [out, in] in the forward), else stored as [K, N] (the same weight in the input gradient).
struct Shape {
  int64_t m, n, k;
  bool trans_b;
};

dnnl::memory::desc plain_b(const Shape& s, int64_t k) {
  return dnnl::memory::desc({k, s.n}, dt::bf16, s.trans_b ? dims{1, k} : dims{s.n, 1});
}

Shape shape_of(const benchmark::State& state) {
  return {state.range(0), state.range(1), state.range(2), state.range(3) != 0};
}

struct Operands {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  explicit Operands(const Shape& s)
      : a(random_bf16(static_cast<size_t>(s.m * s.k), 1)),
        b(random_bf16(static_cast<size_t>(s.k * s.n), 2)),
        c(static_cast<size_t>(s.m * s.n)) {}
};

void set_flops(benchmark::State& state, const Shape& s) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(s.m * s.n * s.k),
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

void BM_Current(benchmark::State& state) {
  const Shape s = shape_of(state);
  Operands ops(s);
  const int64_t rt = DNNL_RUNTIME_DIM_VAL;
  const dnnl::matmul mm(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(dnnl::memory::desc({rt, rt}, dt::bf16, dims{rt, 1}), plain_b(s, rt),
                         dnnl::memory::desc({rt, s.n}, dt::f32, dims{s.n, 1})),
      engine()));
  dnnl::stream stream(engine());
  for (auto _ : state) {
    // As the engine does per call: memory objects over the caller's buffers.
    dnnl::memory a({{s.m, s.k}, dt::bf16, dims{s.k, 1}}, engine(), ops.a.data());
    dnnl::memory b(plain_b(s, s.k), engine(), ops.b.data());
    dnnl::memory c({{s.m, s.n}, dt::f32, dims{s.n, 1}}, engine(), ops.c.data());
    mm.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
  set_flops(state, s);
}

dnnl::matmul::primitive_desc fixed_pd(const Shape& s, bool packed) {
  const dnnl::memory::desc b =
      packed ? dnnl::memory::desc({s.k, s.n}, dt::bf16, dnnl::memory::format_tag::any)
             : plain_b(s, s.k);
  return dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(dnnl::memory::desc({s.m, s.k}, dt::bf16, dims{s.k, 1}), b,
                         dnnl::memory::desc({s.m, s.n}, dt::f32, dims{s.n, 1})),
      engine());
}

void run_fixed(benchmark::State& state, bool packed) {
  const Shape s = shape_of(state);
  Operands ops(s);
  const dnnl::matmul::primitive_desc pd = fixed_pd(s, packed);
  const dnnl::matmul mm(pd);
  dnnl::stream stream(engine());
  dnnl::memory b_plain(plain_b(s, s.k), engine(), ops.b.data());
  dnnl::memory b = b_plain;
  if (packed) {  // the once-per-optimizer-step reorder, outside the timed loop
    b = dnnl::memory(pd.weights_desc(), engine());
    dnnl::reorder(b_plain, b).execute(stream, b_plain, b);
    stream.wait();
  }
  dnnl::memory a(pd.src_desc(), engine(), ops.a.data());
  dnnl::memory c(pd.dst_desc(), engine(), ops.c.data());
  for (auto _ : state) {
    mm.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
  set_flops(state, s);
  state.SetLabel(packed ? "packed" : "plain");
}

void BM_FixedPlain(benchmark::State& state) {
  run_fixed(state, false);
}
void BM_FixedPacked(benchmark::State& state) {
  run_fixed(state, true);
}

// The per-step cost of pre-packing one weight: its reorder into the primitive's layout.
void BM_Reorder(benchmark::State& state) {
  const Shape s = shape_of(state);
  Operands ops(s);
  const dnnl::matmul::primitive_desc pd = fixed_pd(s, true);
  dnnl::stream stream(engine());
  dnnl::memory b_plain(plain_b(s, s.k), engine(), ops.b.data());
  dnnl::memory b(pd.weights_desc(), engine());
  const dnnl::reorder reorder(b_plain, b);
  for (auto _ : state) {
    reorder.execute(stream, b_plain, b);
    stream.wait();
  }
}

// {M, N, K, trans_b}: the default model's bf16 GEMMs with a weight operand.
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "tb"});
  b->Args({2048, 768, 256, 1});    // q, k, v projections, forward
  b->Args({2048, 256, 768, 0});    // their input gradient
  b->Args({2048, 256, 256, 1});    // output projection, forward
  b->Args({2048, 4096, 256, 1});   // LM head, forward
  b->Args({2048, 256, 4096, 0});   // LM head, input gradient
  b->Args({512, 1024, 256, 1});    // one expert's gate/up, forward (~512 rows)
  b->Args({512, 256, 1024, 0});    // its input gradient
  b->Args({512, 256, 512, 1});     // one expert's down projection, forward
  b->Args({2048, 2048, 2048, 1});  // square, for DESIGN.md's machine-ceiling figures
  b->Unit(benchmark::kMicrosecond);
}

// {M, N, K, trans_b} over a grid, for where fixed-shape primitives pay (gemm_bf16.cpp's
// fixed_shape_pays): M 512 and 2048, N and K 256, 1024 and 4096, B read transposed.
void Grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "tb"});
  for (const int64_t m : {512, 2048})
    for (const int64_t n : {256, 1024, 4096})
      for (const int64_t k : {256, 1024, 4096}) b->Args({m, n, k, 1});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Current)->Apply(Shapes);
BENCHMARK(BM_FixedPlain)->Apply(Shapes);
BENCHMARK(BM_Current)->Name("BM_CurrentGrid")->Apply(Grid);
BENCHMARK(BM_FixedPlain)->Name("BM_FixedPlainGrid")->Apply(Grid);
BENCHMARK(BM_FixedPacked)->Apply(Shapes);
BENCHMARK(BM_Reorder)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
