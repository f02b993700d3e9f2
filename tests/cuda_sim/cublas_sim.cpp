// A CPU stand-in for cuBLAS and cuBLASLt, for the CUDA backend's tests on a machine without a GPU
// (tests/cuda_sim): the backend's GEMMs (src/kernels/cuda/gemm_lt.cpp, mx_gemm_block_scaled.cpp)
// run unchanged against it. "Device memory" is host memory; a GEMM is issued on its stream (the
// handle's for cublasGemmEx) like every other work of cudasim: run at once, or recorded while the
// stream is captured into a graph (sim_state.h). An operand in host memory the device cannot
// address is the device's illegal address, as a kernel's would be.
//
// Emulated, with cuBLAS's documented semantics: D = alpha op(A) op(B) + beta C, column-major,
// op(A) m x k, op(B) k x n, C and D m x n, leading dimensions from the arguments (cublasGemmEx)
// or the layouts (cublasLtMatmul). A and B both CUDA_R_32F or both CUDA_R_16BF (bf16 widened
// exactly), C and D CUDA_R_32F, CUBLAS_COMPUTE_32F with fp32 alpha and beta. Each output's dot
// product is summed in float in k order, then alpha * sum + beta * c; with beta == 0, C is not
// read (cuBLAS allows it to hold anything, NaN included).
//
// On a Blackwell device (CUDASIM_ARCH=sm_100, sim_state.h), cuBLASLt's block-scaled FP8 GEMM too,
// as the cuBLAS documentation describes it ("Narrow Precision Data Types Usage" and "1D Block
// Scaling Factors Layout"): A and B CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 codes (not both E5M2, for
// which cuBLAS has no kernel), each with CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 scales (one
// E8M0 code per 32 values along k, in the documented tiled layout), the TN layout (A transposed,
// B not: both k-major), k a multiple of 32, C and D CUDA_R_32F, fp32 compute. Each 32-value
// block's products are summed in float in k order, scaled by the two blocks' powers of two (a
// scale code 255 is NaN), and the blocks summed in k order. The scales' whole tiled extent (rows
// padded to 128, blocks to 4), which cuBLASLt reads, must lie in device memory, and a NaN scale in
// the blocks' padding poisons the row's outputs (its blocks multiply zeros: only NaN shows).
//
// Refused: every other type, compute type, batch, order, epilogue and scaling
// (CUBLAS_STATUS_NOT_SUPPORTED), and inconsistent arguments (CUBLAS_STATUS_INVALID_VALUE).
// cuBLASLt's heuristic answers as the emulated GPU's would for the backend: on Hopper (sm_90, the
// default) no block-scaled (MX) or FP8 GEMM (NOT_SUPPORTED, so the backend takes its bf16 path),
// and, like cuBLASLt's vector-load kernels, no algorithm for operands promised less than 16-byte
// alignment or whose leading dimension is not a multiple of 16 bytes (so the backend's
// cublasGemmEx fallback runs in the tests too).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "core/mx_types.h"
#include "sim_state.h"

struct cublasContext {
  cudaStream_t stream = nullptr;  // cublasSetStream's: where cublasGemmEx issues its work
};

struct cublasLtContext {};

namespace {

// ---- Element types ------------------------------------------------------------------------

bool is_8bit_float(int type) {
  return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2 || type == CUDA_R_8F_UE8M0;
}

// The operand types the GEMMs compute with.
bool is_emulated_operand(int type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF;
}

int64_t element_bytes(int type) {
  if (is_8bit_float(type)) return 1;
  return type == CUDA_R_16BF ? 2 : 4;
}

// bf16 is the high half of an fp32, so widening it is exact.
float bf16_to_float(uint16_t bits) {
  const uint32_t word = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// ---- The GEMM -----------------------------------------------------------------------------

// A column-major operand as stored: element (row, col) at data[row + col * ld].
struct Matrix {
  const void* data;
  int type;  // CUDA_R_32F or CUDA_R_16BF
  int64_t ld;
};

float element(const Matrix& matrix, int64_t row, int64_t col) {
  const int64_t index = row + col * matrix.ld;
  if (matrix.type == CUDA_R_32F) return static_cast<const float*>(matrix.data)[index];
  return bf16_to_float(static_cast<const uint16_t*>(matrix.data)[index]);
}

// The products and sums below are rounded one by one whatever the build's flags (-march=native
// would otherwise let the compiler fuse them into FMAs), so that a test can expect exact values.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

// D = alpha op(A) op(B) + beta C for checked arguments (m, n > 0). op(A)'s rows and op(B)'s
// columns are first gathered into float so that each dot product runs over contiguous values;
// the sum's order (k ascending, in float) is what is fixed.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Matrix& a,
          const Matrix& b, float beta, const float* c, int64_t ldc, float* d, int64_t ldd) {
  std::vector<float> a_rows(static_cast<size_t>(m * k)), b_cols(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      a_rows[static_cast<size_t>(i * k + l)] = trans_a ? element(a, l, i) : element(a, i, l);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < k; ++l)
      b_cols[static_cast<size_t>(j * k + l)] = trans_b ? element(b, j, l) : element(b, l, j);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float* a_row = a_rows.data() + i * k;
      const float* b_col = b_cols.data() + j * k;
      float sum = 0.0f;
      for (int64_t l = 0; l < k; ++l) sum += a_row[l] * b_col[l];
      // In place (C == D) is fine: each element is read before it is written.
      d[i + j * ldd] = beta == 0.0f ? alpha * sum : alpha * sum + beta * c[i + j * ldc];
    }
  }
}

// An FP8 code's value: cuBLAS's CUDA_R_8F_E4M3 and CUDA_R_8F_E5M2 are OCP's formats, which the
// project's own decoder reads (core/mx_types.h, checked against ml_dtypes on every code).
float fp8_value(int type, uint8_t code) {
  return moecore::mx::decode_elem(
      type == CUDA_R_8F_E4M3 ? moecore::mx::ElemType::kE4M3 : moecore::mx::ElemType::kE5M2, code);
}

// A k-major FP8 operand with its tiled scales: the value of (row, l) at codes[l + row * ld].
struct ScaledOperand {
  const uint8_t* codes;
  int type;
  int64_t ld;
  const uint8_t* scales;
};

// D = alpha op(A) op(B) + beta C in the TN layout: op(A)'s row i is A's column i and op(B)'s
// column j is B's column j, both k contiguous values, with their blocks' scales (see the top).
void gemm_block_scaled(int64_t m, int64_t n, int64_t k, float alpha, const ScaledOperand& a,
                       const ScaledOperand& b, float beta, const float* c, int64_t ldc, float* d,
                       int64_t ldd) {
  const int64_t blocks = k / 32, padded_blocks = (blocks + 3) / 4 * 4;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      // The padding's blocks past k contribute 0 x their scales: nothing, unless a scale there is
      // NaN (255), which poisons the output as it would on the tensor cores.
      for (int64_t block = blocks; block < padded_blocks; ++block)
        if (a.scales[cudasim::block_scale_offset(i, block, blocks)] == 255 ||
            b.scales[cudasim::block_scale_offset(j, block, blocks)] == 255)
          sum = std::numeric_limits<float>::quiet_NaN();
      for (int64_t block = 0; block < blocks; ++block) {
        float block_sum = 0.0f;
        for (int64_t l = block * 32; l < block * 32 + 32; ++l)
          block_sum +=
              fp8_value(a.type, a.codes[l + i * a.ld]) * fp8_value(b.type, b.codes[l + j * b.ld]);
        const uint8_t scale_a = a.scales[cudasim::block_scale_offset(i, block, blocks)];
        const uint8_t scale_b = b.scales[cudasim::block_scale_offset(j, block, blocks)];
        sum += scale_a == 255 || scale_b == 255
                   ? std::numeric_limits<float>::quiet_NaN()
                   : std::ldexp(block_sum, (scale_a - 127) + (scale_b - 127));
      }
      d[i + j * ldd] = beta == 0.0f ? alpha * sum : alpha * sum + beta * c[i + j * ldc];
    }
  }
}

#if !defined(__clang__) && defined(__GNUC__)
#pragma GCC pop_options
#endif

int64_t g_block_scaled_gemms_run = 0;  // executed, for the emulator's tests

// Issues the GEMM on `stream` (alpha and beta are taken now, as cuBLAS takes host scalars when
// the call is made), after checking that the device can address its operands.
void issue_gemm(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const Matrix& a, const Matrix& b, float beta, const float* c,
                int64_t ldc, float* d, int64_t ldd) {
  for (const void* operand :
       {a.data, b.data, static_cast<const void*>(c), static_cast<const void*>(d)}) {
    if (operand != nullptr && cudasim::memory_kind(operand) == cudasim::MemoryKind::kPageableHost) {
      cudasim::record_error(cudaErrorIllegalAddress, true,
                            "a cuBLAS GEMM operand points to host memory the device cannot "
                            "address");
      return;
    }
  }
  cudasim::issue_stream_work(
      stream, [=] { gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, ldc, d, ldd); });
}

// CUBLAS_OP_C is CUBLAS_OP_T for real types.
bool is_valid_op(int op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

int64_t at_least_one(int64_t value) {
  return value > 1 ? value : 1;
}

// ---- cuBLASLt's descriptors ---------------------------------------------------------------

// Each descriptor's state lives in the toolkit's semi-opaque structure (heap-allocated by its
// Create, freed by its Destroy); the magic number catches a handle that is not one.
struct LayoutState {
  static constexpr uint32_t kMagic = 0x4c61796fu;
  uint32_t magic = kMagic;
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch_count = 1;
  uint32_t batch_mode = 0;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int64_t batch_offset = 0, plane_offset = 0;
};

struct DescState {
  static constexpr uint32_t kMagic = 0x44657363u;
  static constexpr uint32_t kEpilogueDefault = 1;  // CUBLASLT_EPILOGUE_DEFAULT
  uint32_t magic = kMagic;
  int32_t compute_type = CUBLAS_COMPUTE_32F;
  int32_t scale_type = CUDA_R_32F;
  int32_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N, trans_c = CUBLAS_OP_N;
  uint32_t epilogue = kEpilogueDefault;
  int32_t scale_mode[4] = {};         // A, B, C, D: CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
  const void* scale_pointer[4] = {};  // A, B, C, D
};

struct PreferenceState {
  static constexpr uint32_t kMagic = 0x50726566u;
  uint32_t magic = kMagic;
  uint32_t search_mode = 0;
  uint32_t reduction_scheme_mask = 0xffffffffu;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
  float max_waves_count = 0.0f;
  uint64_t max_workspace_bytes = 0;
  uint64_t impl_mask = ~uint64_t{0};
};

template <typename State, typename Opaque>
cublasStatus_t create_state(Opaque** out) {
  static_assert(sizeof(State) <= sizeof(Opaque::data) && alignof(State) <= alignof(Opaque));
  if (out == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Opaque* opaque = new (std::nothrow) Opaque{};
  if (opaque == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  new (opaque->data) State{};
  *out = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

// The descriptor's state, or null when the handle is not a live descriptor of that kind.
template <typename State, typename Opaque>
State* state_of(Opaque* opaque) {
  if (opaque == nullptr) return nullptr;
  State* state = std::launder(reinterpret_cast<State*>(opaque->data));
  return state->magic == State::kMagic ? state : nullptr;
}

template <typename State, typename Opaque>
cublasStatus_t destroy_state(Opaque* opaque) {
  if (opaque == nullptr) return CUBLAS_STATUS_SUCCESS;
  State* state = state_of<State>(opaque);
  if (state == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  state->magic = 0;  // a stale handle used again is refused while the memory still says so
  delete opaque;
  return CUBLAS_STATUS_SUCCESS;
}

// An attribute's value, which cuBLASLt takes only with its exact size.
template <typename T>
cublasStatus_t set_value(T& field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt's problem -------------------------------------------------------------------

struct LtProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const LayoutState *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  // The block-scaled GEMM's scales of A and B (null for the plain GEMM).
  const void *a_scales = nullptr, *b_scales = nullptr;
};

bool same_layout(const LayoutState& x, const LayoutState& y) {
  return x.type == y.type && x.order == y.order && x.rows == y.rows && x.cols == y.cols &&
         x.ld == y.ld && x.batch_count == y.batch_count;
}

// Checks an operation and its layouts and gives the problem's shape: NOT_SUPPORTED for what is
// not emulated (and what sm_90 has no kernel for), INVALID_VALUE for inconsistent arguments.
cublasStatus_t describe(cublasLtMatmulDesc_t desc_handle, cublasLtMatrixLayout_t a_handle,
                        cublasLtMatrixLayout_t b_handle, cublasLtMatrixLayout_t c_handle,
                        cublasLtMatrixLayout_t d_handle, LtProblem* problem) {
  const DescState* op = state_of<DescState>(desc_handle);
  const LayoutState* a = state_of<LayoutState>(a_handle);
  const LayoutState* b = state_of<LayoutState>(b_handle);
  const LayoutState* c = state_of<LayoutState>(c_handle);
  const LayoutState* d = state_of<LayoutState>(d_handle);
  if (op == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;

  // Block-scaled (MX) operands need Blackwell's MX tensor cores, which a Hopper GPU lacks: its
  // cuBLASLt answers NOT_SUPPORTED and the backend takes its bf16 path. On Blackwell, the one
  // block-scaled GEMM emulated (see the top); FP8 without block scales is not emulated.
  const bool block_scaled = op->scale_mode[0] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
                            op->scale_mode[1] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  if (block_scaled) {
    if (cudasim::compute_capability_major() < 10) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (int operand = 0; operand < 2; ++operand)
      if (op->scale_mode[operand] != CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const LayoutState* layout : {a, b})
      if (layout->type != CUDA_R_8F_E4M3 && layout->type != CUDA_R_8F_E5M2)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->trans_a != CUBLAS_OP_T || op->trans_b != CUBLAS_OP_N)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->scale_pointer[0] == nullptr || op->scale_pointer[1] == nullptr)
      return CUBLAS_STATUS_INVALID_VALUE;
  } else {
    for (const LayoutState* layout : {a, b})
      if (is_8bit_float(static_cast<int>(layout->type))) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->scale_pointer[0] != nullptr || op->scale_pointer[1] != nullptr)
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (const LayoutState* layout : {c, d})
    if (is_8bit_float(static_cast<int>(layout->type))) return CUBLAS_STATUS_NOT_SUPPORTED;
  // C's and D's scaling goes with FP8 outputs, not emulated; nor is anything beyond the GEMM.
  if (op->scale_mode[2] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
      op->scale_mode[3] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
      op->scale_pointer[2] != nullptr || op->scale_pointer[3] != nullptr)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (op->compute_type != CUBLAS_COMPUTE_32F || op->scale_type != CUDA_R_32F ||
      (op->pointer_mode != CUBLAS_POINTER_MODE_HOST &&
       op->pointer_mode != CUBLAS_POINTER_MODE_DEVICE) ||
      op->trans_c != CUBLAS_OP_N || op->epilogue != DescState::kEpilogueDefault)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((!block_scaled && (a->type != b->type || !is_emulated_operand(static_cast<int>(a->type)))) ||
      c->type != CUDA_R_32F || d->type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const LayoutState* layout : {a, b, c, d})
    if (layout->order != CUBLASLT_ORDER_COL || layout->batch_count != 1 ||
        layout->plane_offset != 0)
      return CUBLAS_STATUS_NOT_SUPPORTED;

  if (!is_valid_op(op->trans_a) || !is_valid_op(op->trans_b)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!same_layout(*c, *d)) return CUBLAS_STATUS_INVALID_VALUE;
  for (const LayoutState* layout : {a, b, c})
    if (layout->rows > static_cast<uint64_t>(INT64_MAX) ||
        layout->cols > static_cast<uint64_t>(INT64_MAX) ||
        layout->ld < at_least_one(static_cast<int64_t>(layout->rows)))
      return CUBLAS_STATUS_INVALID_VALUE;
  problem->trans_a = op->trans_a != CUBLAS_OP_N;
  problem->trans_b = op->trans_b != CUBLAS_OP_N;
  const auto a_rows = static_cast<int64_t>(a->rows), a_cols = static_cast<int64_t>(a->cols);
  const auto b_rows = static_cast<int64_t>(b->rows), b_cols = static_cast<int64_t>(b->cols);
  problem->m = problem->trans_a ? a_cols : a_rows;
  problem->k = problem->trans_a ? a_rows : a_cols;
  problem->n = problem->trans_b ? b_rows : b_cols;
  const int64_t b_k = problem->trans_b ? b_cols : b_rows;
  if (b_k != problem->k || static_cast<int64_t>(c->rows) != problem->m ||
      static_cast<int64_t>(c->cols) != problem->n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (block_scaled) {
    if (problem->k % 32 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // whole 32-value blocks
    problem->a_scales = op->scale_pointer[0];
    problem->b_scales = op->scale_pointer[1];
  }
  problem->a = a;
  problem->b = b;
  problem->c = c;
  problem->d = d;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLASLt's kernels load 16 bytes at a time: a column whose start is not 16-byte aligned leaves
// them none.
bool leading_dimensions_fit_kernels(const LtProblem& problem) {
  for (const LayoutState* layout : {problem.a, problem.b, problem.c, problem.d})
    if (layout->ld * element_bytes(static_cast<int>(layout->type)) % 16 != 0) return false;
  return true;
}

// Issues the block-scaled GEMM of a checked problem on `stream`. When it runs, every operand must
// be in device memory and the scales' whole tiled extent inside one allocation (cuBLASLt reads
// the padding too); else the device's illegal address, as a kernel's would be.
void issue_block_scaled_gemm(cudaStream_t stream, const LtProblem& problem, float alpha,
                             const void* a, const void* b, float beta, const float* c, float* d) {
  const ScaledOperand a_operand{static_cast<const uint8_t*>(a), static_cast<int>(problem.a->type),
                                problem.a->ld, static_cast<const uint8_t*>(problem.a_scales)};
  const ScaledOperand b_operand{static_cast<const uint8_t*>(b), static_cast<int>(problem.b->type),
                                problem.b->ld, static_cast<const uint8_t*>(problem.b_scales)};
  const int64_t m = problem.m, n = problem.n, k = problem.k, ldc = problem.c->ld,
                ldd = problem.d->ld;
  cudasim::issue_stream_work(stream, [=] {
    const int64_t blocks = k / 32;
    const struct {
      const void* pointer;
      int64_t bytes;
      const char* what;
    } extents[] = {{a_operand.scales, cudasim::block_scale_bytes(m, blocks), "A's scales"},
                   {b_operand.scales, cudasim::block_scale_bytes(n, blocks), "B's scales"},
                   {a_operand.codes, a_operand.ld * (m - 1) + k, "A"},
                   {b_operand.codes, b_operand.ld * (n - 1) + k, "B"},
                   {d, (ldd * (n - 1) + m) * 4, "D"},
                   {c, beta == 0.0f ? 0 : (ldc * (n - 1) + m) * 4, "C"}};
    for (const auto& extent : extents) {
      if (extent.bytes > 0 &&
          !cudasim::inside_device_allocation(extent.pointer, static_cast<size_t>(extent.bytes))) {
        cudasim::record_error(cudaErrorIllegalAddress, true,
                              std::string("a block-scaled cuBLASLt GEMM's ") + extent.what + " (" +
                                  std::to_string(extent.bytes) +
                                  " bytes) is not inside one device allocation");
        return;
      }
    }
    ++g_block_scaled_gemms_run;
    gemm_block_scaled(m, n, k, alpha, a_operand, b_operand, beta, c, ldc, d, ldd);
  });
}

constexpr uint32_t kKernelAlignment = 16;
constexpr uint64_t kAlgoMagic = 0x416c676f53696dull;

bool aligned(const void* p, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

}  // namespace

extern "C" {

// ---- cuBLAS -------------------------------------------------------------------------------

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasContext{};
  return *handle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}

// As the toolkit's: the workspace must be device memory aligned to 256 bytes (the cuBLAS
// documentation of cublasSetWorkspace); a size of 0 returns to the library's own.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                     size_t workspaceSizeInBytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspaceSizeInBytes == 0) return CUBLAS_STATUS_SUCCESS;
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0 ||
      !cudasim::inside_device_allocation(workspace, workspaceSizeInBytes))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// The names, for the tests' messages (the toolkit's cublasGetStatusString gives a sentence).
const char* cublasGetStatusName(cublasStatus_t status) {
  return status_name(status);
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return status_name(status);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t /*algo: a hint, every one computes the same*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!is_valid_op(transa) || !is_valid_op(transb) || m < 0 || n < 0 || k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool trans_a = transa != CUBLAS_OP_N, trans_b = transb != CUBLAS_OP_N;
  // As stored: A is m x k (k x m transposed), B is k x n (n x k transposed).
  if (lda < at_least_one(trans_a ? k : m) || ldb < at_least_one(trans_b ? n : k) ||
      ldc < at_least_one(m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || Atype != Btype || !is_emulated_operand(Atype) ||
      Ctype != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (alpha == nullptr || beta == nullptr || C == nullptr ||
      (k > 0 && (A == nullptr || B == nullptr)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  issue_gemm(handle->stream, trans_a, trans_b, m, n, k, alpha_value, {A, Atype, lda},
             {B, Btype, ldb}, beta_value, static_cast<const float*>(C), ldc, static_cast<float*>(C),
             ldc);
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt -----------------------------------------------------------------------------

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new (std::nothrow) cublasLtContext{};
  return *lightHandle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  return status_name(status);
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  return status_name(status);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  const cublasStatus_t status = create_state<LayoutState>(matLayout);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  LayoutState* layout = state_of<LayoutState>(*matLayout);
  layout->type = static_cast<uint32_t>(type);
  layout->rows = rows;
  layout->cols = cols;
  layout->ld = ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return destroy_state<LayoutState>(matLayout);
}

// Every attribute is kept; the ones that are not emulated (another order, a batch, planar
// complex) are refused when the layout is used.
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  LayoutState* layout = state_of<LayoutState>(matLayout);
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return set_value(layout->type, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return set_value(layout->order, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return set_value(layout->rows, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return set_value(layout->cols, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return set_value(layout->ld, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return set_value(layout->batch_count, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set_value(layout->batch_offset, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      return set_value(layout->plane_offset, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
      return set_value(layout->batch_mode, buf, sizeInBytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  const cublasStatus_t status = create_state<DescState>(matmulDesc);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  DescState* op = state_of<DescState>(*matmulDesc);
  op->compute_type = computeType;
  op->scale_type = scaleType;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return destroy_state<DescState>(matmulDesc);
}

// The attributes a plain or scaled GEMM sets are kept (and refused when the descriptor is used
// if not emulated); bias, epilogue buffers, amax and the like are refused at once rather than
// ignored.
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  DescState* op = state_of<DescState>(matmulDesc);
  if (op == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return set_value(op->compute_type, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return set_value(op->scale_type, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return set_value(op->pointer_mode, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_value(op->trans_a, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_value(op->trans_b, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return set_value(op->trans_c, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_value(op->epilogue, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return set_value(op->scale_pointer[0], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return set_value(op->scale_pointer[1], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
      return set_value(op->scale_pointer[2], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
      return set_value(op->scale_pointer[3], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
      return set_value(op->scale_mode[0], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
      return set_value(op->scale_mode[1], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE:
      return set_value(op->scale_mode[2], buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE:
      return set_value(op->scale_mode[3], buf, sizeInBytes);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create_state<PreferenceState>(pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy_state<PreferenceState>(pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  PreferenceState* preference = state_of<PreferenceState>(pref);
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return set_value(preference->search_mode, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_value(preference->max_workspace_bytes, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set_value(preference->reduction_scheme_mask, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_value(preference->min_alignment[0], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_value(preference->min_alignment[1], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_value(preference->min_alignment[2], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_value(preference->min_alignment[3], buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return set_value(preference->max_waves_count, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return set_value(preference->impl_mask, buf, sizeInBytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// One algorithm, needing no workspace, where a Hopper GPU's cuBLASLt would have a kernel (see
// the top); none (SUCCESS, count 0) where only the alignment is in the way. The algorithm
// records the alignments it was promised, which cublasLtMatmul then holds the pointers to.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const PreferenceState* pref = state_of<PreferenceState>(preference);
  if (pref == nullptr || requestedAlgoCount < 1 || heuristicResultsArray == nullptr ||
      returnAlgoCount == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  LtProblem problem;
  const cublasStatus_t status = describe(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &problem);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  *returnAlgoCount = 0;
  for (const uint32_t alignment : pref->min_alignment)
    if (alignment < kKernelAlignment) return CUBLAS_STATUS_SUCCESS;
  if (!leading_dimensions_fit_kernels(problem)) return CUBLAS_STATUS_SUCCESS;

  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  result = cublasLtMatmulHeuristicResult_t{};
  result.algo.data[0] = kAlgoMagic;
  for (int operand = 0; operand < 4; ++operand)
    result.algo.data[1 + operand] = pref->min_alignment[operand];
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  LtProblem problem;
  const cublasStatus_t status = describe(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &problem);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (workspaceSizeInBytes > 0 && workspace == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr && algo->data[0] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
  // Without an algorithm cuBLASLt asks its heuristic, with the default preferences; either way
  // the kernel must exist for these layouts, and the pointers must be as aligned as promised.
  if (!leading_dimensions_fit_kernels(problem)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const void* const pointers[4] = {A, B, C, D};
  for (int operand = 0; operand < 4; ++operand) {
    const uint64_t promised = algo != nullptr ? algo->data[1 + operand] : kKernelAlignment;
    const bool unused_c = operand == 2 && C == nullptr;  // checked below against beta
    if (!unused_c && !aligned(pointers[operand], promised)) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (problem.m == 0 || problem.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (alpha == nullptr || beta == nullptr || D == nullptr ||
      (problem.k > 0 && (A == nullptr || B == nullptr)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  if (beta_value != 0.0f && C == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (problem.a_scales != nullptr) {
    issue_block_scaled_gemm(stream, problem, alpha_value, A, B, beta_value,
                            static_cast<const float*>(C), static_cast<float*>(D));
    return CUBLAS_STATUS_SUCCESS;
  }
  issue_gemm(stream, problem.trans_a, problem.trans_b, problem.m, problem.n, problem.k, alpha_value,
             {A, static_cast<int>(problem.a->type), problem.a->ld},
             {B, static_cast<int>(problem.b->type), problem.b->ld}, beta_value,
             static_cast<const float*>(C), problem.c->ld, static_cast<float*>(D), problem.d->ld);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace cudasim {

int64_t block_scale_offset(int64_t row, int64_t block, int64_t blocks) {
  const int64_t tiles_along_k = (blocks + 3) / 4;
  return ((row / 128) * tiles_along_k + block / 4) * 512 + (row % 32) * 16 + (row % 128 / 32) * 4 +
         block % 4;
}

int64_t block_scale_bytes(int64_t rows, int64_t blocks) {
  return (rows + 127) / 128 * 128 * ((blocks + 3) / 4 * 4);
}

int64_t block_scaled_gemms_run() {
  return g_block_scaled_gemms_run;
}

}  // namespace cudasim
