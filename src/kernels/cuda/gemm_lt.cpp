// cuBLASLt is column-major: a row-major [r, c] matrix is the column-major [c, r] one with the same
// bytes, so the row-major c = op(a) op(b) is issued as the column-major c^T = op(b)^T op(a)^T:
// b's storage is cuBLASLt's first operand and a's its second, each with its own transpose flag.
//
// Making the descriptors and asking cuBLASLt's heuristic for an algorithm costs the host tens of
// microseconds, as much as a small GEMM takes on the GPU; an expert's GEMMs at 128 experts are
// that small. So each problem (shape, transposes, operand type, alignments) is planned once and
// its plan kept; the experts' row counts change from step to step, so the plans are bounded
// (kMaxPlans, all dropped when full: a step's shapes are planned again in its first GEMMs).
#include "kernels/cuda/gemm_lt.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/check.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/lt_descriptors.h"
#include "kernels/cuda/runtime.h"

namespace moecore::kernels::cuda {

namespace {

using lt::alignment_of;
using lt::Layout;
using lt::MatmulDesc;
using lt::Preference;

// What a GEMM's descriptors and algorithm depend on.
struct GemmProblem {
  bool trans_a, trans_b;
  int64_t m, n, k;
  cudaDataType_t operand_type;
  uint32_t align_a, align_b, align_c;
  bool operator==(const GemmProblem&) const = default;
};

struct GemmProblemHash {
  size_t operator()(const GemmProblem& p) const {
    size_t h = std::hash<int64_t>{}(p.m);
    for (const int64_t value :
         {p.n, p.k, int64_t{p.trans_a}, int64_t{p.trans_b}, static_cast<int64_t>(p.operand_type),
          int64_t{p.align_a}, int64_t{p.align_b}, int64_t{p.align_c}})
      h = h * 1000003u ^ std::hash<int64_t>{}(value);
    return h;
  }
};

// One problem's descriptors and the heuristic's algorithm; none where cuBLASLt has no kernel for
// it (then cuBLAS's general GEMM runs it).
struct GemmPlan {
  explicit GemmPlan(const GemmProblem& p)
      : b_layout(p.operand_type, p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k),
        a_layout(p.operand_type, p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m),
        c_layout(CUDA_R_32F, p.n, p.m) {
    op.set(CUBLASLT_MATMUL_DESC_TRANSA, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    op.set(CUBLASLT_MATMUL_DESC_TRANSB, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    Preference preference;
    preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kGemmWorkspaceBytes);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_b);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_a);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        cublaslt_handle(), op.get(), b_layout.get(), a_layout.get(), c_layout.get(), c_layout.get(),
        preference.get(), 1, &heuristic, &found);
    // cuBLASLt's kernels want leading dimensions and addresses aligned for vector loads; an odd
    // extent (a test's 7 x 17, a vocabulary of odd size) may leave none.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
        (status == CUBLAS_STATUS_SUCCESS &&
         (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS)))
      return;
    MOE_CUBLAS_CHECK(status);
    lt_has_kernel = true;
    algo = heuristic.algo;
  }

  MatmulDesc op;
  Layout b_layout, a_layout, c_layout;
  bool lt_has_kernel = false;
  cublasLtMatmulAlgo_t algo{};
};

constexpr size_t kMaxPlans = 4096;

// The plan of `problem`, made on first use; kept until the process ends or the table fills
// (shared: a plan dropped from a full table lives on in the call that holds it).
std::shared_ptr<const GemmPlan> plan_for(const GemmProblem& problem) {
  static std::mutex mutex;
  static std::unordered_map<GemmProblem, std::shared_ptr<const GemmPlan>, GemmProblemHash> plans;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = plans.find(problem);
  if (found != plans.end()) return found->second;
  if (plans.size() >= kMaxPlans) plans.clear();
  auto plan = std::make_shared<const GemmPlan>(problem);
  plans.emplace(problem, plan);
  return plan;
}

}  // namespace

void gemm_lt(const char* op, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const void* a, const void* b, cudaDataType_t operand_type, float beta,
             float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c (cuBLASLt has no kernel for k = 0)
    if (beta == 0.0f) {
      MOE_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(m * n) * sizeof(float), stream()));
    } else {
      launch_scale(c, beta, c, m * n, stream());
      MOE_CUDA_CHECK_LAUNCH(op, "launch_scale");
    }
    return;
  }
  const std::shared_ptr<const GemmPlan> planned = plan_for(
      {trans_a, trans_b, m, n, k, operand_type, alignment_of(a), alignment_of(b), alignment_of(c)});
  const GemmPlan& plan = *planned;
  if (!plan.lt_has_kernel) {
    // cuBLAS's general GEMM takes any layout, with the same column-major mapping and fp32
    // accumulation (and int extents).
    MOE_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX,
              "[{}] m={} n={} k={}: an extent beyond 2^31 - 1 for cuBLAS's general GEMM", op, m, n,
              k);
    MOE_CUBLAS_CHECK(cublasGemmEx(
        cublas_handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, operand_type,
        static_cast<int>(trans_b ? k : n), a, operand_type, static_cast<int>(trans_a ? m : k),
        &beta, c, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    MOE_CUDA_CHECK_LAUNCH(op, "cublasGemmEx");
    return;
  }
  MOE_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), plan.op.get(), &alpha, b, plan.b_layout.get(),
                                  a, plan.a_layout.get(), &beta, c, plan.c_layout.get(), c,
                                  plan.c_layout.get(), &plan.algo, gemm_workspace(),
                                  kGemmWorkspaceBytes, stream()));
  MOE_CUDA_CHECK_LAUNCH(op, "cublasLtMatmul");
}

}  // namespace moecore::kernels::cuda
