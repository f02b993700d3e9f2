// Softmax cross-entropy and the LM head's z-loss on the GPU (cross_entropy.cu): the losses stay
// on the device, so nothing
// waits; a target outside the vocabulary counts as ignored instead of being reported (reading it
// back would wait: the model checks targets on the host, where they come from).
#include "kernels/cross_entropy_checks.h"
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

void cross_entropy(ConstTensorView logits, ConstTensorView targets, TensorView dlogits, float scale,
                   float z_loss_coef, ConstTensorView normalizer, TensorView losses) {
  constexpr const char* kOp = "cross_entropy";
  expect_on_device(kOp, "normalizer", normalizer);
  expect_normalizer(kOp, normalizer, Device::kCuda);
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "targets", targets);
  expect_on_device(kOp, "losses", losses);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [rows, vocab], got rank {}", kOp,
            logits.rank());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_shape(kOp, "logits", logits, {rows, vocab}, Device::kCuda);
  expect_shape(kOp, "targets", targets, {rows}, Device::kCuda);
  expect_shape(kOp, "losses", losses, {kHeadLosses}, Device::kCuda);
  const float* lp = logits.data<float>(kOp);
  const int32_t* tp = targets.data<int32_t>(kOp);
  double* means = losses.data<double>(kOp);
  float* dlp = nullptr;
  if (dlogits.raw() != nullptr) {
    expect_shape(kOp, "dlogits", dlogits, {rows, vocab}, Device::kCuda);
    dlp = dlogits.data<float>(kOp);
  }
  if (rows == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(means, 0, kHeadLosses * sizeof(double), stream()));
    return;
  }
  // The row losses (kHeadLosses per row), then the counted targets.
  const StreamScratch scratch(
      sizeof(double) * kHeadLosses * static_cast<size_t>(rows) + sizeof(long long), stream());
  double* row_losses = scratch.as<double>();
  auto* counted = reinterpret_cast<long long*>(row_losses + kHeadLosses * rows);
  launch_cross_entropy(lp, tp, dlp, rows, vocab, scale, z_loss_coef,
                       view_given(normalizer) ? normalizer.data<double>(kOp) : nullptr, row_losses,
                       counted, means, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_cross_entropy");
}

}  // namespace moecore::kernels::cuda
