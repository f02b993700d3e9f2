// Token embedding on the GPU (embedding.cu), checked as the CPU backend checks it, token ids
// included: they are on the device, so their check is queued with the kernels and a bad one is
// reported at the next synchronisation (index_checks.h; an error, as on the CPU, not a silent
// NaN), without making the call wait.
#include <cstdint>

#include "kernels/cuda/device_views.h"
#include "kernels/cuda/index_checks.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void embedding_forward(ConstTensorView tokens, ConstTensorView w, TensorView out) {
  constexpr const char* kOp = "embedding";
  expect_on_device(kOp, "tokens", tokens);
  expect_on_device(kOp, "w", w);
  MOE_CHECK(w.rank() == 2, "[{}] w must be [vocab, dim], got rank {}", kOp, w.rank());
  const int64_t rows = tokens.size(0), vocab = w.size(0), dim = w.size(1);
  expect_shape(kOp, "tokens", tokens, {rows}, Device::kCuda);
  expect_shape(kOp, "w", w, {vocab, dim}, Device::kCuda);
  expect_shape(kOp, "out", out, {rows, dim}, Device::kCuda);
  const int32_t* tp = tokens.data<int32_t>(kOp);
  const float* wp = w.data<float>(kOp);
  float* op = out.data<float>(kOp);
  check_indices_inside(kOp, "tokens", tp, rows, vocab);
  launch_embedding_forward(tp, wp, op, rows, vocab, dim, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_embedding_forward");
}

void embedding_backward(ConstTensorView tokens, ConstTensorView dout, TensorView dw,
                        int64_t padding_idx) {
  constexpr const char* kOp = "embedding_backward";
  expect_on_device(kOp, "tokens", tokens);
  expect_on_device(kOp, "dout", dout);
  MOE_CHECK(dw.rank() == 2, "[{}] dw must be [vocab, dim], got rank {}", kOp, dw.rank());
  const int64_t rows = tokens.size(0), vocab = dw.size(0), dim = dw.size(1);
  expect_shape(kOp, "tokens", tokens, {rows}, Device::kCuda);
  expect_shape(kOp, "dout", dout, {rows, dim}, Device::kCuda);
  expect_shape(kOp, "dw", dw, {vocab, dim}, Device::kCuda);
  const int32_t* tp = tokens.data<int32_t>(kOp);
  const float* gp = dout.data<float>(kOp);
  float* dwp = dw.data<float>(kOp);
  MOE_CHECK(rows <= INT32_MAX, "[{}] {} rows: the sort by token takes fewer than 2^31", kOp, rows);
  check_indices_inside(kOp, "tokens", tp, rows, vocab);
  const StreamScratch scratch(embedding_backward_scratch_bytes(rows), stream());
  MOE_CUDA_CHECK(launch_embedding_backward(tp, gp, dwp, rows, vocab, dim, padding_idx,
                                           scratch.as<unsigned char>(), stream()));
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_embedding_backward");
}

}  // namespace moecore::kernels::cuda
