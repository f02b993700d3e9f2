// cudasim: the warp matrix operations (WMMA) the grouped GEMM uses. Every lane holds the whole
// tile (the hardware spreads it over the warp's registers in a layout it does not document, so
// device code may not depend on it, and the kernels here do not read fragment elements) and
// computes it on its own. On the device these are warp collectives; here they do not wait for the
// warp (a rendezvous per call made the captured training step's test several times slower), so a
// warp that diverges around them is not reported: the kernels' __syncthreads around their shared
// tiles are.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment;

// A: M x K, B: K x N, the accumulator: M x N; elements by (row, column), row-major.
template <typename Use, int M, int N, int K>
struct FragmentShape {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
struct fragment {
  static constexpr int rows = FragmentShape<Use, M, N, K>::rows;
  static constexpr int cols = FragmentShape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
  T& at(int r, int c) { return x[r * cols + c]; }
  const T& at(int r, int c) const { return x[r * cols + c]; }
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T value) {
  for (T& v : f.x) v = value;
}

// The layout of the operands in memory is the fragment's own (row_major or col_major).
// WMMA's requirements of its memory operands (CUDA C++ Programming Guide, "Warp Matrix
// Functions"): a 256-bit aligned pointer, ldm a multiple of 16 bytes. Broken, the launch fails.
template <typename T>
void check_operand(const T* p, unsigned int ldm, const char* call) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0)
    cudasim::report_fault(std::string(call) + ": a pointer not 32-byte aligned or an ldm of " +
                          std::to_string(ldm) + " elements, not a multiple of 16 bytes");
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned int ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
  check_operand(p, ldm, "wmma::load_matrix_sync");
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.at(r, c) = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float, void>& f,
                       unsigned int ldm, layout_t layout) {
  check_operand(p, ldm, "wmma::store_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.at(r, c);
}

// d = a b + c, each product exact in fp32 (bf16 x bf16) and summed in k order onto c.
template <int M, int N, int K, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float, void>& d,
              const fragment<matrix_a, M, N, K, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, M, N, K, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, M, N, K, float, void>& c) {
  fragment<accumulator, M, N, K, float, void> result;
  for (int r = 0; r < M; ++r)
    for (int col = 0; col < N; ++col) {
      float sum = c.at(r, col);
      for (int k = 0; k < K; ++k)
        sum += __bfloat162float(a.at(r, k)) * __bfloat162float(b.at(k, col));
      result.at(r, col) = sum;
    }
  d = result;
}

}  // namespace nvcuda::wmma
