// Softmax cross-entropy on the GPU (cross_entropy.cu), checked as the CPU backend checks it. The
// loss comes back to the host, so this waits; a target outside the vocabulary is found on the
// device and reported once the result is back.
#include "kernels/cuda/device_views.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/view_checks.h"

namespace moecore::kernels::cuda {

CrossEntropyResult cross_entropy(ConstTensorView logits, ConstTensorView targets,
                                 TensorView dlogits, float scale, int64_t normalizer) {
  constexpr const char* kOp = "cross_entropy";
  expect_on_device(kOp, "logits", logits);
  expect_on_device(kOp, "targets", targets);
  MOE_CHECK(logits.rank() == 2, "[{}] logits must be [rows, vocab], got rank {}", kOp,
            logits.rank());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_shape(kOp, "logits", logits, {rows, vocab}, Device::kCuda);
  expect_shape(kOp, "targets", targets, {rows}, Device::kCuda);
  const float* lp = logits.data<float>(kOp);
  const int32_t* tp = targets.data<int32_t>(kOp);
  float* dlp = nullptr;
  if (dlogits.raw() != nullptr) {
    expect_shape(kOp, "dlogits", dlogits, {rows, vocab}, Device::kCuda);
    dlp = dlogits.data<float>(kOp);
  }
  if (rows == 0) return {0.0, 0};
  // The totals, then the row losses (8-byte aligned after them).
  static_assert(sizeof(CrossEntropyTotals) % sizeof(double) == 0);
  const StreamScratch scratch(
      sizeof(CrossEntropyTotals) + sizeof(double) * static_cast<size_t>(rows), stream());
  CrossEntropyTotals* device_totals = scratch.as<CrossEntropyTotals>();
  double* row_loss = reinterpret_cast<double*>(device_totals + 1);
  launch_cross_entropy(lp, tp, dlp, rows, vocab, scale, normalizer, row_loss, device_totals,
                       stream());
  MOE_CUDA_CHECK(cudaGetLastError());
  CrossEntropyTotals totals{};
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(&totals, device_totals, sizeof(totals), cudaMemcpyDeviceToHost, stream()));
  synchronize();
  if (totals.first_bad_row < rows) {
    int32_t target = 0;
    MOE_CUDA_CHECK(cudaMemcpyAsync(&target, tp + totals.first_bad_row, sizeof(target),
                                   cudaMemcpyDeviceToHost, stream()));
    synchronize();
    fail("[{}] target {} at row {} is outside [0, {})", kOp, target, totals.first_bad_row, vocab);
  }
  const int64_t divisor = normalizer > 0 ? normalizer : totals.counted;
  return {divisor > 0 ? totals.loss_sum / static_cast<double>(divisor) : 0.0, totals.counted};
}

}  // namespace moecore::kernels::cuda
