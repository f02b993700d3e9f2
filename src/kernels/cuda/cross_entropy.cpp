// Softmax cross-entropy on the GPU (cross_entropy.cu): the loss stays on the device, so nothing
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
                   ConstTensorView normalizer, TensorView loss) {
  constexpr const char* kOp = "cross_entropy";
  expect_on_device(kOp, "normalizer", normalizer);
  expect_normalizer(kOp, normalizer, Device::kCuda);
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "targets", targets);
  expect_on_device(kOp, "loss", loss);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [rows, vocab], got rank {}", kOp,
            logits.rank());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_shape(kOp, "logits", logits, {rows, vocab}, Device::kCuda);
  expect_shape(kOp, "targets", targets, {rows}, Device::kCuda);
  expect_shape(kOp, "loss", loss, {1}, Device::kCuda);
  const float* lp = logits.data<float>(kOp);
  const int32_t* tp = targets.data<int32_t>(kOp);
  double* mean = loss.data<double>(kOp);
  float* dlp = nullptr;
  if (dlogits.raw() != nullptr) {
    expect_shape(kOp, "dlogits", dlogits, {rows, vocab}, Device::kCuda);
    dlp = dlogits.data<float>(kOp);
  }
  if (rows == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(mean, 0, sizeof(double), stream()));
    return;
  }
  // The row losses, then the counted targets.
  const StreamScratch scratch(sizeof(double) * static_cast<size_t>(rows) + sizeof(long long),
                              stream());
  double* row_loss = scratch.as<double>();
  auto* counted = reinterpret_cast<long long*>(row_loss + rows);
  launch_cross_entropy(lp, tp, dlp, rows, vocab, scale,
                       view_given(normalizer) ? normalizer.data<double>(kOp) : nullptr, row_loss,
                       counted, mean, stream());
  MOE_CUDA_CHECK_LAUNCH(kOp, "launch_cross_entropy");
}

}  // namespace moecore::kernels::cuda
