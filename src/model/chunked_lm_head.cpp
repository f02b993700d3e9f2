#include "model/chunked_lm_head.h"

#include <algorithm>
#include <span>

#include "kernels/ops.h"

namespace moecore {

int64_t LmHeadChunks::rows(int64_t chunk) const {
  return std::min(chunk_tokens, tokens - first_row(chunk));
}

void chunked_lm_head_forward(kernels::MatmulPrecision precision, const float* hidden,
                             const LinearWeight& weight, const int32_t* targets,
                             const LmHeadChunks& shape, ConstTensorView counted, TensorView losses,
                             Workspace& workspace, const LmHeadChunkObserver& observe) {
  const int64_t d = shape.hidden, v = shape.vocab;
  Workspace::Scope scratch(workspace);
  const std::span<float> logits = scratch.uninitialized<float>(shape.largest_rows() * v);
  auto* chunk_losses = static_cast<std::byte*>(losses.raw());
  constexpr size_t kChunkBytes = kernels::kHeadLosses * sizeof(double);
  for (int64_t c = 0; c < shape.count(); ++c) {
    const int64_t first = shape.first_row(c), rows = shape.rows(c);
    linear_forward(precision, hidden + first * d, weight, logits.data(), rows, d, v);
    if (observe) observe(first, view(logits.data(), {rows, v}));
    // Forward only (no logit gradient, so no z-loss coefficient): the backward makes it from
    // logits computed again.
    kernels::cross_entropy(
        view(logits.data(), {rows, v}), view(targets + first, {rows}), TensorView(), 1.0f, 0.0f,
        counted, TensorView(chunk_losses + c * kChunkBytes, {kernels::kHeadLosses}, DType::kF64));
  }
}

void lm_head_backward_from_logits(kernels::MatmulPrecision precision, const float* logits,
                                  const float* hidden, const LinearWeight& weight,
                                  const int32_t* targets, int64_t rows, int64_t hidden_size,
                                  int64_t vocab, ConstTensorView counted, float z_loss_coef,
                                  float loss_scale, float* dlogits, float* dhidden, float* dweight,
                                  Workspace& workspace) {
  Workspace::Scope scratch(workspace);
  // The cross-entropy writes the losses again; the forward's are the ones read.
  const std::span<double> losses = scratch.uninitialized<double>(kernels::kHeadLosses);
  kernels::cross_entropy(view(logits, {rows, vocab}), view(targets, {rows}),
                         view(dlogits, {rows, vocab}), 1.0f, z_loss_coef, counted,
                         view(losses.data(), {kernels::kHeadLosses}));
  // Scaled for gradient accumulation (loss_scale is 1 / micro-batches) after the cross-entropy's
  // own 1 / counted: one rounding each, whichever head runs.
  if (loss_scale != 1.0f)
    kernels::scale(view(dlogits, {rows, vocab}), loss_scale, view(dlogits, {rows, vocab}));
  linear_backward(precision, dlogits, hidden, weight, dhidden, dweight, rows, hidden_size, vocab,
                  false);
}

void chunked_lm_head_backward(kernels::MatmulPrecision precision, const float* hidden,
                              const LinearWeight& weight, const int32_t* targets,
                              const LmHeadChunks& shape, ConstTensorView counted, float z_loss_coef,
                              float loss_scale, float* dhidden, float* dweight,
                              Workspace& workspace, const LmHeadChunkObserver& observe) {
  const int64_t d = shape.hidden, v = shape.vocab;
  Workspace::Scope scratch(workspace);
  const std::span<float> logits = scratch.uninitialized<float>(shape.largest_rows() * v);
  const std::span<float> dlogits = scratch.uninitialized<float>(shape.largest_rows() * v);
  for (int64_t c = 0; c < shape.count(); ++c) {
    const int64_t first = shape.first_row(c), rows = shape.rows(c);
    linear_forward(precision, hidden + first * d, weight, logits.data(), rows, d, v);
    lm_head_backward_from_logits(precision, logits.data(), hidden + first * d, weight,
                                 targets + first, rows, d, v, counted, z_loss_coef, loss_scale,
                                 dlogits.data(), dhidden + first * d, dweight, workspace);
    if (observe) observe(first, view(dlogits.data(), {rows, v}));
  }
}

}  // namespace moecore
