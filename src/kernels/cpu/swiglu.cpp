// SwiGLU on the CPU: rows over the OpenMP pool, the per-row bodies SIMD-cloned with the
// vectorisable exp of core/simd.h.
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

MOECORE_SIMD_CLONES void swiglu_forward_row(const float* g, const float* u, float* a,
                                            int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    a[j] = g[j] * sig * u[j];
  }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig)).
MOECORE_SIMD_CLONES void swiglu_backward_row(const float* da, const float* g, const float* u,
                                             float* dg, float* du, int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    const float silu = g[j] * sig;
    du[j] = da[j] * silu;
    dg[j] = da[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
  }
}

}  // namespace

void swiglu_forward(ConstTensorView gu, TensorView act) {
  constexpr const char* kOp = "swiglu";
  MOE_CHECK(act.rank() == 2, "[{}] act must be [rows, hidden], got rank {}", kOp, act.rank());
  const int64_t rows = act.size(0), hidden = act.size(1);
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden});
  expect_shape(kOp, "act", act, {rows, hidden});
  const float* gup = gu.data<float>(kOp);
  float* ap = act.data<float>(kOp);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gup + r * 2 * hidden;
    swiglu_forward_row(g, g + hidden, ap + r * hidden, hidden);
  }
}

void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  constexpr const char* kOp = "swiglu_backward";
  MOE_CHECK(dact.rank() == 2, "[{}] dact must be [rows, hidden], got rank {}", kOp, dact.rank());
  const int64_t rows = dact.size(0), hidden = dact.size(1);
  expect_shape(kOp, "dact", dact, {rows, hidden});
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden});
  expect_shape(kOp, "dgu", dgu, {rows, 2 * hidden});
  const float* dap = dact.data<float>(kOp);
  const float* gup = gu.data<float>(kOp);
  float* dgup = dgu.data<float>(kOp);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gup + r * 2 * hidden;
    float* dg = dgup + r * 2 * hidden;
    swiglu_backward_row(dap + r * hidden, g, g + hidden, dg, dg + hidden, hidden);
  }
}

}  // namespace moecore::kernels::cpu
