// SwiGLU on the CPU: rows over the OpenMP pool, the per-row bodies SIMD-cloned with the
// vectorisable exp of core/simd.h. An output in bf16 (act, or dgu: read only by bf16 GEMMs) is the
// fp32 value rounded by float_to_bf16, in the same pass.
#include "core/bf16.h"
#include "core/simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cpu {

namespace {

template <typename Out>
MOECORE_SIMD_CLONES void swiglu_forward_row(const float* g, const float* u, Out* a,
                                            int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    store_value(a + j, g[j] * sig * u[j]);
  }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig)).
template <typename Out>
MOECORE_SIMD_CLONES void swiglu_backward_row(const float* da, const float* g, const float* u,
                                             Out* dg, Out* du, int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) {
    const float sig = 1.0f / (1.0f + exp_vectorizable(-g[j]));
    const float silu = g[j] * sig;
    store_value(du + j, da[j] * silu);
    store_value(dg + j, da[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig)));
  }
}

template <typename Out>
void swiglu_forward_rows(const float* gu, Out* act, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    swiglu_forward_row(g, g + hidden, act + r * hidden, hidden);
  }
}

template <typename Out>
void swiglu_backward_rows(const float* dact, const float* gu, Out* dgu, int64_t rows,
                          int64_t hidden) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * hidden;
    Out* dg = dgu + r * 2 * hidden;
    swiglu_backward_row(dact + r * hidden, g, g + hidden, dg, dg + hidden, hidden);
  }
}

}  // namespace

void swiglu_forward(ConstTensorView gu, TensorView act) {
  constexpr const char* kOp = "swiglu";
  MOE_CHECK(act.rank() == 2, "[{}] act must be [rows, hidden], got rank {}", kOp, act.rank());
  const int64_t rows = act.size(0), hidden = act.size(1);
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden});
  expect_shape(kOp, "act", act, {rows, hidden});
  expect_f32_or_bf16(kOp, "act", act);
  const float* gup = gu.data<float>(kOp);
  if (act.dtype() == DType::kBf16)
    swiglu_forward_rows(gup, bf16_bits(kOp, act), rows, hidden);
  else
    swiglu_forward_rows(gup, act.data<float>(kOp), rows, hidden);
}

void swiglu_backward(ConstTensorView dact, ConstTensorView gu, TensorView dgu) {
  constexpr const char* kOp = "swiglu_backward";
  MOE_CHECK(dact.rank() == 2, "[{}] dact must be [rows, hidden], got rank {}", kOp, dact.rank());
  const int64_t rows = dact.size(0), hidden = dact.size(1);
  expect_shape(kOp, "dact", dact, {rows, hidden});
  expect_shape(kOp, "gu", gu, {rows, 2 * hidden});
  expect_shape(kOp, "dgu", dgu, {rows, 2 * hidden});
  expect_f32_or_bf16(kOp, "dgu", dgu);
  const float* dap = dact.data<float>(kOp);
  const float* gup = gu.data<float>(kOp);
  if (dgu.dtype() == DType::kBf16)
    swiglu_backward_rows(dap, gup, bf16_bits(kOp, dgu), rows, hidden);
  else
    swiglu_backward_rows(dap, gup, dgu.data<float>(kOp), rows, hidden);
}

}  // namespace moecore::kernels::cpu
