// Flash attention on the GPU (flash_attention.cu), checked as every backend checks it. The values
// of doc_start stay unchecked here (reading them back would wait for the stream); the kernels
// read each clamped to [0, position].
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/flash_attention_checks.h"

namespace moecore::kernels::cuda {

namespace {

// The kernels' limits: a head dimension of at most kFlashAttentionMaxHeadDim (the rows a thread
// team keeps in registers), heads and batch within the grid's y and z extents.
void expect_kernel_limits(const char* op, const FlashAttentionDims& s) {
  MOE_CHECK(s.head_dim <= kFlashAttentionMaxHeadDim,
            "[{}] head_dim={} is larger than the CUDA flash attention kernels take ({})", op,
            s.head_dim, kFlashAttentionMaxHeadDim);
  MOE_CHECK(s.heads <= 65535 && s.batch <= 65535,
            "[{}] heads={} and batch={} must be at most 65535 (the grid's extents)", op, s.heads,
            s.batch);
}

const int32_t* doc_start_data(const char* op, ConstTensorView doc_start) {
  return doc_start.raw() != nullptr ? doc_start.data<int32_t>(op) : nullptr;
}

}  // namespace

void flash_attention_forward(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                             TensorView out, TensorView lse, ConstTensorView doc_start,
                             MatmulPrecision precision) {
  constexpr const char* kOp = "flash_attention";
  expect_on_device(kOp, "q", q);
  expect_on_device(kOp, "k", k);
  expect_on_device(kOp, "v", v);
  if (doc_start.raw() != nullptr) expect_on_device(kOp, "doc_start", doc_start);  // empty: none
  const FlashAttentionDims s = flash_attention_dims(kOp, q, k, v, doc_start, Device::kCuda);
  expect_flash_forward_outputs(kOp, s, out, lse, Device::kCuda);
  expect_kernel_limits(kOp, s);
  launch_flash_attention_forward(q.data<float>(kOp), k.data<float>(kOp), v.data<float>(kOp),
                                 doc_start_data(kOp, doc_start), out.data<float>(kOp),
                                 lse.data<float>(kOp), s.batch, s.seq, s.heads, s.kv_heads,
                                 s.head_dim, precision == MatmulPrecision::kBf16, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_flash_attention_forward");
}

void flash_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                              ConstTensorView doc_start, TensorView dq, TensorView dk,
                              TensorView dv, MatmulPrecision precision) {
  constexpr const char* kOp = "flash_attention_backward";
  expect_on_device(kOp, "dout", dout);
  expect_on_device(kOp, "q", q);
  expect_on_device(kOp, "k", k);
  expect_on_device(kOp, "v", v);
  expect_on_device(kOp, "out", out);
  expect_on_device(kOp, "lse", lse);
  if (doc_start.raw() != nullptr) expect_on_device(kOp, "doc_start", doc_start);  // empty: none
  const FlashAttentionDims s = flash_attention_dims(kOp, q, k, v, doc_start, Device::kCuda);
  expect_flash_backward_views(kOp, s, dout, out, lse, dq, dk, dv, Device::kCuda);
  expect_kernel_limits(kOp, s);
  // D = dout . out per query row, read by both gradient kernels.
  const StreamScratch row_dots(static_cast<size_t>(s.batch * s.seq * s.heads) * sizeof(float),
                               stream());
  launch_flash_attention_backward(
      dout.data<float>(kOp), q.data<float>(kOp), k.data<float>(kOp), v.data<float>(kOp),
      out.data<float>(kOp), lse.data<float>(kOp), doc_start_data(kOp, doc_start),
      dq.data<float>(kOp), dk.data<float>(kOp), dv.data<float>(kOp), row_dots.as<float>(), s.batch,
      s.seq, s.heads, s.kv_heads, s.head_dim, precision == MatmulPrecision::kBf16, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_flash_attention_backward");
}

}  // namespace moecore::kernels::cuda
