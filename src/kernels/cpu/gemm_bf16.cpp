// bf16 GEMMs on the CPU: operands converted to bf16 here (same rounding on both paths), products
// accumulated in fp32, C written in fp32.
//
// An operand that is bf16 already (a weight copy, gemm_bf16_b16; an activation rounded once for
// several GEMMs, gemm_bf16_a16; both, gemm_bf16_ab16) skips its conversion.
//
// Native path: oneDNN's matmul primitive (bf16 src/weights, f32 dst; alpha as an output scale,
// beta as a sum post-op). Creating a primitive costs ~0.3 ms (measured), more than many of the
// expert GEMMs themselves, and the experts' row counts change every step, so one primitive with a
// runtime M and K serves every call of a kind; it selects oneDNN's jit bf16 gemm (runtime N as
// well would fall back to the reference kernel, so N stays in the key). On AMX a fixed-shape
// primitive on dense operands runs brgemm AMX kernels, much faster: there the row-major calls
// that pay run their rows rounded down (fixed_rows) through a fixed-shape primitive and the rest
// through the runtime one (run_native). Primitives, streams, the execution arguments of the call
// shapes met (memory objects re-pointed per call) and conversion buffers are per thread: the
// attention calls GEMMs from inside OpenMP regions.
#include <oneapi/dnnl/dnnl.h>

#include <bit>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/gemm_k0.h"
#include "kernels/cpu/scratch_vector.h"
#include "kernels/gemm.h"

namespace moecore::kernels {

namespace {

struct PrimitiveKey {
  bool trans_a, trans_b;
  int64_t n, ldc;
  uint32_t alpha_bits, beta_bits;
  bool operator==(const PrimitiveKey&) const = default;
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const {
    size_t h = std::hash<int64_t>()(key.n);
    for (const uint64_t v :
         {static_cast<uint64_t>(key.ldc),
          static_cast<uint64_t>(key.alpha_bits) << 2 | key.trans_a << 1 | key.trans_b,
          static_cast<uint64_t>(key.beta_bits)})
      h = h * 0x9e3779b97f4a7c15ull + std::hash<uint64_t>()(v);
    return h;
  }
};

// One call's shape under a primitive: what its memory descriptors depend on.
struct CallShape {
  PrimitiveKey key;
  int64_t m, k;
  bool operator==(const CallShape&) const = default;
};

struct CallShapeHash {
  size_t operator()(const CallShape& shape) const {
    return PrimitiveKeyHash()(shape.key) * 0x9e3779b97f4a7c15ull +
           (std::hash<int64_t>()(shape.m) ^ std::hash<int64_t>()(shape.k) << 1);
  }
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Call shapes whose execution arguments a thread keeps, and fixed-shape primitives it keeps
// (bounded: the experts' row counts change from step to step; all are dropped when full, and the
// next calls make theirs again).
constexpr size_t kMaxCallShapes = 1024;
constexpr size_t kMaxFixedShapes = 512;

// A fixed-shape primitive with its execution arguments (memory objects re-pointed per call); no
// primitive where oneDNN would not run the shape on AMX tiles (then the runtime one serves it).
struct FixedShapeMatmul {
  std::optional<dnnl::matmul> matmul;
  std::unordered_map<int, dnnl::memory> arguments;
};

struct ThreadState {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<PrimitiveKey, dnnl::matmul, PrimitiveKeyHash> primitives;
  // The source, weights and destination memory objects of a shape met before, in the argument
  // map execute() takes: a call of that shape only points them at its operands. Making the three
  // objects and the map costs about a quarter of a 64 x 128 x 64 GEMM (flash attention's block
  // GEMMs, thousands a step), measured on an AMX Xeon.
  std::unordered_map<CallShape, std::unordered_map<int, dnnl::memory>, CallShapeHash> arguments;
  std::unordered_map<CallShape, FixedShapeMatmul, CallShapeHash> fixed_shapes;
  std::vector<uint16_t> a16, b16;  // converted operands
  std::vector<float> a32, b32;     // rounded operands of the emulated path
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// A as the matmul's [M, K] source over the converted buffer, which keeps A's stored layout
// ([K, M] when trans_a); with a runtime M or K the strides are runtime too.
dnnl::memory::desc a_desc(bool trans_a, int64_t m, int64_t k) {
  return dnnl::memory::desc({m, k}, dt::bf16, trans_a ? dims{1, m} : dims{k, 1});
}

// B as the matmul's [K, N] weights over the converted buffer, which keeps B's stored layout.
dnnl::memory::desc b_desc(bool trans_b, int64_t n, int64_t k) {
  return dnnl::memory::desc({k, n}, dt::bf16, trans_b ? dims{1, k} : dims{n, 1});
}

dnnl::memory::desc c_desc(int64_t m, int64_t n, int64_t ldc) {
  return dnnl::memory::desc({m, n}, dt::f32, dims{ldc, 1});
}

dnnl::matmul::primitive_desc matmul_pd(const PrimitiveKey& key, int64_t m, int64_t k, float alpha,
                                       float beta) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(a_desc(key.trans_a, m, k), b_desc(key.trans_b, key.n, k),
                         c_desc(m, key.n, key.ldc)),
      attr, cpu_engine());
}

// The primitive of `key` with a runtime M and K.
const dnnl::matmul& primitive_for(ThreadState& state, const PrimitiveKey& key, float alpha,
                                  float beta) {
  auto found = state.primitives.find(key);
  if (found != state.primitives.end()) return found->second;
  const dnnl::memory::dim runtime = DNNL_RUNTIME_DIM_VAL;
  return state.primitives.emplace(key, dnnl::matmul(matmul_pd(key, runtime, runtime, alpha, beta)))
      .first->second;
}

// The memory objects of one call shape, with no buffers behind them (each call points them at
// its operands).
std::unordered_map<int, dnnl::memory> arguments_of(const CallShape& shape) {
  const dnnl::engine& engine = cpu_engine();
  const PrimitiveKey& key = shape.key;
  return {
      {DNNL_ARG_SRC, dnnl::memory(a_desc(key.trans_a, shape.m, shape.k), engine, DNNL_MEMORY_NONE)},
      {DNNL_ARG_WEIGHTS,
       dnnl::memory(b_desc(key.trans_b, key.n, shape.k), engine, DNNL_MEMORY_NONE)},
      {DNNL_ARG_DST, dnnl::memory(c_desc(shape.m, key.n, key.ldc), engine, DNNL_MEMORY_NONE)}};
}

// The execution arguments of a call of `shape.key`'s runtime primitive, made on first use.
std::unordered_map<int, dnnl::memory>& arguments_for(ThreadState& state, const CallShape& shape) {
  auto found = state.arguments.find(shape);
  if (found != state.arguments.end()) return found->second;
  if (state.arguments.size() >= kMaxCallShapes) state.arguments.clear();
  return state.arguments.emplace(shape, arguments_of(shape)).first->second;
}

// The primitive made for exactly `shape`, with its execution arguments, made on first use; none
// where oneDNN picks a kernel other than its AMX brgemm for it (the plain jit gemm the runtime
// primitive runs anyway: its creation would buy nothing).
FixedShapeMatmul& fixed_shape_for(ThreadState& state, const CallShape& shape, float alpha,
                                  float beta) {
  auto found = state.fixed_shapes.find(shape);
  if (found != state.fixed_shapes.end()) return found->second;
  if (state.fixed_shapes.size() >= kMaxFixedShapes) state.fixed_shapes.clear();
  const dnnl::matmul::primitive_desc pd = matmul_pd(shape.key, shape.m, shape.k, alpha, beta);
  FixedShapeMatmul fixed;
  if (std::string_view(pd.impl_info_str()).starts_with("brg")) {
    fixed.matmul.emplace(pd);
    fixed.arguments = arguments_of(shape);
  }
  return state.fixed_shapes.emplace(shape, std::move(fixed)).first->second;
}

void execute(ThreadState& state, const dnnl::matmul& matmul,
             std::unordered_map<int, dnnl::memory>& arguments, const uint16_t* a16,
             const uint16_t* b16, float* c) {
  // oneDNN takes non-const handles; the matmul only reads its source and weights.
  arguments.at(DNNL_ARG_SRC).set_data_handle(const_cast<uint16_t*>(a16));
  arguments.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<uint16_t*>(b16));
  arguments.at(DNNL_ARG_DST).set_data_handle(c);
  matmul.execute(state.stream, arguments);
  state.stream.wait();
}

// Where oneDNN runs bf16 matmuls on AMX tiles, a primitive made for one fixed shape selects its
// brgemm AMX kernels, up to 1.9x faster than the jit gemm a runtime M selects, on small and middle
// row-major calls only. bench/micro/bf16_prepack.cpp's grid (oneDNN 2.6, AMX Xeon, 2 threads, M
// 512 and 2048, N and K 256 to 4096, B transposed; bench/results/bf16_prepack.md): the fixed
// shape ran 1.02-1.92x as fast wherever K <= 1024 and B (K x N) held at most 2^20 values, and
// 0.81-1.14x elsewhere (it packs B inside every call); at the model's GEMMs an expert's gate/up
// forward 1024 x 512 x 256 went 249 -> 159 us, the LM head's forward 2048 x 4096 x 256 4.9 -> 3.6
// ms. The weight gradients (A read transposed, the sum over the tokens) ran as fast or faster on
// the runtime primitive (the LM head's 4096 x 256 x 2048: 2.9 ms against 3.5) and cost 1-2 ms
// each to make, so they keep it. Without AMX the two kinds ran alike (AVX512-BF16): there the
// runtime primitive serves every call.
bool amx_tiles() {
  static const bool amx = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned amx_bits = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
    return (isa & amx_bits) == amx_bits;
  }();
  return amx;
}

constexpr int64_t kMaxFixedShapeK = 1024;
constexpr int64_t kMaxFixedShapeWeights = int64_t{1} << 20;

// A fixed-shape primitive costs ~0.3 ms to make, so the shapes that get one must be few and
// repeat: the row count is rounded down (fixed_rows), N must be a multiple of 64 (a model's
// widths are; flash attention's key ranges are under document masking, any length), and oneDNN
// takes its AMX kernel only for dense operands (a C with ldc > N, as flash attention writes its
// heads into [T, H * hd], would get the jit gemm).
bool fixed_shape_pays(bool trans_a, int64_t n, int64_t k, int64_t ldc) {
  return amx_tiles() && !trans_a && k <= kMaxFixedShapeK && n * k <= kMaxFixedShapeWeights &&
         n % 64 == 0 && ldc == n;
}

// The rows that go through the fixed-shape primitive: M rounded down to a multiple of a step, 64
// below 1024 rows, then doubling with each doubling of M (128 from 1024, 256 from 2048, ...). A
// kind of call so meets at most 16 row counts below 1024 and 8 in each doubling above, whatever
// the batch (the default model makes ~90 primitives in its first steps, ~30 ms in all); the
// last rows (under 64, or under an eighth of M from 1024 rows) go through the runtime primitive.
// The split depends only on the call's shape: a shape gives the same bits on every call, rank and
// resume.
int64_t fixed_rows(int64_t m) {
  int64_t step = 64;
  while (step * 16 <= m) step *= 2;
  return m / step * step;
}

PrimitiveKey key_of(bool trans_a, bool trans_b, int64_t n, int64_t ldc, float alpha, float beta) {
  return {trans_a, trans_b, n, ldc, std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)};
}

// A call's first rows and the fixed-shape primitive that takes them; no rows where the call runs
// on the runtime primitive alone.
struct FixedPart {
  FixedShapeMatmul* primitive = nullptr;
  int64_t rows = 0;
};

FixedPart fixed_part_of(ThreadState& state, const PrimitiveKey& key, int64_t m, int64_t k,
                        float alpha, float beta) {
  const int64_t rows = fixed_shape_pays(key.trans_a, key.n, k, key.ldc) ? fixed_rows(m) : 0;
  if (rows == 0) return {};
  FixedShapeMatmul& fixed = fixed_shape_for(state, CallShape{key, rows, k}, alpha, beta);
  return fixed.matmul ? FixedPart{&fixed, rows} : FixedPart{};
}

// C[M, N] = alpha op(A) op(B) + beta C on operands already in bf16, each contiguous in its stored
// layout (a transposed copy would cost more than the GEMM's own handling of a transposed
// operand), so that the descriptors' strides follow from M and K.
void run_native(ThreadState& state, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const uint16_t* a16, const uint16_t* b16, float beta, float* c,
                int64_t ldc) {
  const PrimitiveKey key = key_of(trans_a, trans_b, n, ldc, alpha, beta);
  try {
    // Rows [0, fixed.rows) of A (row-major) and of C are dense blocks of their own.
    const FixedPart fixed = fixed_part_of(state, key, m, k, alpha, beta);
    if (fixed.rows > 0)
      execute(state, *fixed.primitive->matmul, fixed.primitive->arguments, a16, b16, c);
    const int64_t first = fixed.rows;  // the first row the runtime primitive takes
    if (first == m) return;
    execute(state, primitive_for(state, key, alpha, beta),
            arguments_for(state, CallShape{key, m - first, k}), a16 + first * k, b16,
            c + first * ldc);
  } catch (const dnnl::error& e) {
    fail("[gemm] oneDNN bf16 matmul failed for m={} n={} k={}: {}", m, n, k, e.what());
  }
}

// An operand stored as [rows, cols] (row stride ld) converted to bf16 into `buffer` (this
// thread's), contiguous in its stored layout.
const uint16_t* converted(std::vector<uint16_t>& buffer, int64_t rows, int64_t cols, const float* x,
                          int64_t ld) {
  cpu::scratch_of_at_least(buffer, rows * cols);
  cpu::convert_to_bf16(x, rows, cols, ld, buffer.data());
  return buffer.data();
}

// The emulated path's operand: the same values rounded to bf16 and kept in fp32.
const float* rounded(std::vector<float>& buffer, int64_t rows, int64_t cols, const float* x,
                     int64_t ld) {
  cpu::scratch_of_at_least(buffer, rows * cols);
  cpu::round_to_bf16(x, rows, cols, ld, buffer.data());
  return buffer.data();
}

// A ([M, K], or [K, M] stored when trans_a) and B ([K, N], or [N, K] when trans_b) through them.
const uint16_t* a_to_bf16(ThreadState& state, bool trans_a, int64_t m, int64_t k, const float* a,
                          int64_t lda) {
  return converted(state.a16, trans_a ? k : m, trans_a ? m : k, a, lda);
}
const float* a_rounded(ThreadState& state, bool trans_a, int64_t m, int64_t k, const float* a,
                       int64_t lda) {
  return rounded(state.a32, trans_a ? k : m, trans_a ? m : k, a, lda);
}
const uint16_t* b_to_bf16(ThreadState& state, bool trans_b, int64_t n, int64_t k, const float* b,
                          int64_t ldb) {
  return converted(state.b16, trans_b ? n : k, trans_b ? k : n, b, ldb);
}
const float* b_rounded(ThreadState& state, bool trans_b, int64_t n, int64_t k, const float* b,
                       int64_t ldb) {
  return rounded(state.b32, trans_b ? n : k, trans_b ? k : n, b, ldb);
}

// C = 0 or beta C for an empty sum; true when nothing is left to multiply.
bool handle_empty(int64_t m, int64_t n, int64_t k, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k > 0) return false;
  cpu::scale_by_beta(m, n, beta, c, ldc);
  return true;
}

}  // namespace

Bf16GemmPath bf16_gemm_path() {
  // Both the CPU (cpuid) and oneDNN's dispatcher (which DNNL_MAX_CPU_ISA may restrict) must
  // allow avx512_core_bf16; without it oneDNN's bf16 matmul would run a slow reference kernel.
  static const Bf16GemmPath path = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    __builtin_cpu_init();
    const bool cpu_has = __builtin_cpu_supports("avx512bf16") != 0;
    return cpu_has && (isa & bf16) == bf16 ? Bf16GemmPath::kNative : Bf16GemmPath::kEmulated;
  }();
  return path;
}

bool bf16_gemm_runs_fixed_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, float beta, int64_t ldc) {
  if (bf16_gemm_path() != Bf16GemmPath::kNative || k == 0) return false;
  try {
    return fixed_part_of(thread_state(), key_of(trans_a, trans_b, n, ldc, alpha, beta), m, k, alpha,
                         beta)
               .rows > 0;
  } catch (const dnnl::error& e) {
    fail("[gemm] oneDNN bf16 matmul failed for m={} n={} k={}: {}", m, n, k, e.what());
  }
}

bool gemms_read_bf16_bits(MatmulPrecision precision) {
  return precision == MatmulPrecision::kBf16 && bf16_gemm_path() == Bf16GemmPath::kNative;
}

void gemm_bf16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
               float* c, int64_t ldc) {
  if (handle_empty(m, n, k, beta, c, ldc)) return;
  ThreadState& state = thread_state();
  if (path == Bf16GemmPath::kNative) {
    run_native(state, trans_a, trans_b, m, n, k, alpha, a_to_bf16(state, trans_a, m, k, a, lda),
               b_to_bf16(state, trans_b, n, k, b, ldb), beta, c, ldc);
  } else {
    gemm_fp32(trans_a, trans_b, m, n, k, alpha, a_rounded(state, trans_a, m, k, a, lda),
              trans_a ? m : k, b_rounded(state, trans_b, n, k, b, ldb), trans_b ? k : n, beta, c,
              ldc);
  }
}

void gemm_bf16_b16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const uint16_t* b16, float beta,
                   float* c, int64_t ldc) {
  if (handle_empty(m, n, k, beta, c, ldc)) return;
  ThreadState& state = thread_state();
  if (path == Bf16GemmPath::kNative) {
    run_native(state, trans_a, trans_b, m, n, k, alpha, a_to_bf16(state, trans_a, m, k, a, lda),
               b16, beta, c, ldc);
  } else {
    // The sgemm needs fp32 operands: B widened (exactly) into this thread's buffer.
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    cpu::scratch_of_at_least(state.b32, k * n);
    cpu::widen_bf16(b16, b_rows * b_cols, state.b32.data());
    gemm_fp32(trans_a, trans_b, m, n, k, alpha, a_rounded(state, trans_a, m, k, a, lda),
              trans_a ? m : k, state.b32.data(), b_cols, beta, c, ldc);
  }
}

void gemm_bf16_a16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const uint16_t* a16, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc) {
  if (handle_empty(m, n, k, beta, c, ldc)) return;
  ThreadState& state = thread_state();
  if (path == Bf16GemmPath::kNative) {
    run_native(state, trans_a, trans_b, m, n, k, alpha, a16,
               b_to_bf16(state, trans_b, n, k, b, ldb), beta, c, ldc);
  } else {
    // A widened (exactly) into this thread's buffer for the sgemm, B rounded.
    cpu::scratch_of_at_least(state.a32, m * k);
    cpu::widen_bf16(a16, m * k, state.a32.data());
    gemm_fp32(trans_a, trans_b, m, n, k, alpha, state.a32.data(), trans_a ? m : k,
              b_rounded(state, trans_b, n, k, b, ldb), trans_b ? k : n, beta, c, ldc);
  }
}

void gemm_bf16_ab16(Bf16GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const uint16_t* a16, const uint16_t* b16, float beta, float* c,
                    int64_t ldc) {
  if (handle_empty(m, n, k, beta, c, ldc)) return;
  ThreadState& state = thread_state();
  if (path == Bf16GemmPath::kNative) {
    run_native(state, trans_a, trans_b, m, n, k, alpha, a16, b16, beta, c, ldc);
  } else {
    // Both widened (exactly) into this thread's buffers for the sgemm.
    cpu::scratch_of_at_least(state.a32, m * k);
    cpu::widen_bf16(a16, m * k, state.a32.data());
    cpu::scratch_of_at_least(state.b32, k * n);
    cpu::widen_bf16(b16, k * n, state.b32.data());
    gemm_fp32(trans_a, trans_b, m, n, k, alpha, state.a32.data(), trans_a ? m : k, state.b32.data(),
              trans_b ? k : n, beta, c, ldc);
  }
}

}  // namespace moecore::kernels
