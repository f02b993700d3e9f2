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
                             const LmHeadChunks& shape, int64_t counted, TensorView losses,
                             Workspace& workspace, const LmHeadChunkObserver& observe) {
  const int64_t d = shape.hidden, v = shape.vocab;
  Workspace::Scope scratch(workspace);
  const std::span<float> logits = scratch.uninitialized<float>(shape.chunk_tokens * v);
  auto* chunk_losses = static_cast<std::byte*>(losses.raw());
  for (int64_t c = 0; c < shape.count(); ++c) {
    const int64_t first = shape.first_row(c), rows = shape.rows(c);
    linear_forward(precision, hidden + first * d, weight, logits.data(), rows, d, v);
    if (observe) observe(first, view(logits.data(), {rows, v}));
    // Forward only (no logit gradient): the backward makes it from logits computed again.
    kernels::cross_entropy(view(logits.data(), {rows, v}), view(targets + first, {rows}),
                           TensorView(), 1.0f, counted,
                           TensorView(chunk_losses + c * sizeof(double), {1}, DType::kF64));
  }
}

void chunked_lm_head_backward(kernels::MatmulPrecision precision, const float* hidden,
                              const LinearWeight& weight, const int32_t* targets,
                              const LmHeadChunks& shape, int64_t counted, float loss_scale,
                              float* dhidden, float* dweight, Workspace& workspace,
                              const LmHeadChunkObserver& observe) {
  const int64_t d = shape.hidden, v = shape.vocab;
  Workspace::Scope scratch(workspace);
  const std::span<float> logits = scratch.uninitialized<float>(shape.chunk_tokens * v);
  const std::span<float> dlogits = scratch.uninitialized<float>(shape.chunk_tokens * v);
  // The cross-entropy writes its loss again; nobody reads this one.
  const std::span<double> loss = scratch.uninitialized<double>(1);
  for (int64_t c = 0; c < shape.count(); ++c) {
    const int64_t first = shape.first_row(c), rows = shape.rows(c);
    linear_forward(precision, hidden + first * d, weight, logits.data(), rows, d, v);
    kernels::cross_entropy(view(logits.data(), {rows, v}), view(targets + first, {rows}),
                           view(dlogits.data(), {rows, v}), 1.0f, counted, view(loss.data(), {1}));
    // As the whole head scales its saved gradient: at scale 1 first, then times loss_scale (the
    // same two roundings), into the logits' buffer, which is not read again.
    const float* chunk_dlogits = dlogits.data();
    if (loss_scale != 1.0f) {
      kernels::scale(view(dlogits.data(), {rows, v}), loss_scale, view(logits.data(), {rows, v}));
      chunk_dlogits = logits.data();
    }
    if (observe) observe(first, view(chunk_dlogits, {rows, v}));
    linear_backward(precision, chunk_dlogits, hidden + first * d, weight, dhidden + first * d,
                    dweight, rows, d, v, false);
  }
}

}  // namespace moecore
