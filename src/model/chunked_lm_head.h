// The LM head and its cross-entropy in chunks of tokens (train.lm_head_chunk_tokens), so that no
// [tokens, vocab] tensor outlives a chunk. The whole head (Transformer without chunks) keeps the
// micro-batch's logits from the forward to the backward and makes their gradient there: N V
// floats kept, N V more while its backward runs, for a 50k vocabulary and 8k tokens 1.6 GB each,
// usually the largest tensors of the pass. Here the forward computes each chunk's logits and loss
// and drops the logits; the backward computes them again, then the chunk's logit gradient, its
// rows of the hidden state's gradient and its share of the head's weight gradient, as Cut
// Cross-Entropy (Wijmans et al., 2024) does. The price is one more head GEMM per micro-batch
// (2 N d V flops); what is alive is one chunk's logits and their gradient.
//
// What equals the whole head: every row's logits, loss and logit gradient are computed by the same
// operations on the same values (a GEMM over fewer rows, the cross-entropy with the same global
// count, the logit gradient made at scale 1 and then multiplied by loss_scale as the whole head
// does). What may differ: the GEMMs run on fewer rows, which a library may block differently along
// the contraction (oneDNN picks its kernel by shape); the loss adds each chunk's share in chunk
// order; and the head's weight gradient adds each chunk's dlogits^T h to the gradient in turn, as
// accumulation over micro-batches does, instead of one GEMM over all tokens. All are fp32 rounding
// of the same sums (tests/cpp/test_chunked_lm_head.cpp bounds them).
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor_view.h"
#include "core/workspace.h"
#include "kernels/matmul_precision.h"
#include "model/linear.h"

namespace moecore {

// tokens rows of `hidden` features against a head of `vocab` rows, in chunks of chunk_tokens rows
// (the last one shorter).
struct LmHeadChunks {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t chunk_tokens = 0;  // > 0
  int64_t count() const { return (tokens + chunk_tokens - 1) / chunk_tokens; }
  int64_t first_row(int64_t chunk) const { return chunk * chunk_tokens; }
  int64_t rows(int64_t chunk) const;
  // The rows of the largest chunk: a chunk_tokens above the micro-batch is one chunk of it all.
  int64_t largest_rows() const { return chunk_tokens < tokens ? chunk_tokens : tokens; }
};

// Sees each chunk's logits (forward) or their scaled gradient (backward), [rows, vocab] where the
// tensors are, with the chunk's first row: what a tensor observer assembles into the whole head's
// "lm_head" and "grad.lm_head" (model/tensor_observer.h).
using LmHeadChunkObserver = std::function<void(int64_t first_row, ConstTensorView values)>;

// losses (=, f64 [shape.count(), kernels::kHeadLosses], where the model's tensors are): chunk c's
// cross-entropy and LM-head z-loss of the logits hidden[rows of c] . W^T over `counted` (f64 [1]
// where the tensors are: the global count of counted targets, which a CUDA graph's replay reads
// anew), so that the chunks' values add up to the micro-batch's mean losses. targets: [tokens] i32
// where the tensors are, kIgnoreIndex allowed. The logits live in `workspace` one chunk at a time.
void chunked_lm_head_forward(kernels::MatmulPrecision precision, const float* hidden,
                             const LinearWeight& weight, const int32_t* targets,
                             const LmHeadChunks& shape, ConstTensorView counted, TensorView losses,
                             Workspace& workspace, const LmHeadChunkObserver& observe = {});

// The head's backward for `rows` rows from their logits (the whole head's kept ones, or a
// chunk's computed again): the gradient of cross-entropy + z_loss_coef z-loss at scale 1 over
// `counted` into dlogits (=) [rows, vocab], multiplied by loss_scale in place (the same two
// roundings for either head), then dhidden (=) [rows, hidden] and dweight (+=) [vocab, hidden].
void lm_head_backward_from_logits(kernels::MatmulPrecision precision, const float* logits,
                                  const float* hidden, const LinearWeight& weight,
                                  const int32_t* targets, int64_t rows, int64_t hidden_size,
                                  int64_t vocab, ConstTensorView counted, float z_loss_coef,
                                  float loss_scale, float* dlogits, float* dhidden, float* dweight,
                                  Workspace& workspace);

// d(loss_scale * (mean loss + z_loss_coef mean z-loss)) of the same forward: dhidden (=) [tokens,
// hidden], dweight (+=) [vocab, hidden]. Each chunk's logits and logit gradient live in `workspace`
// while it runs.
void chunked_lm_head_backward(kernels::MatmulPrecision precision, const float* hidden,
                              const LinearWeight& weight, const int32_t* targets,
                              const LmHeadChunks& shape, ConstTensorView counted, float z_loss_coef,
                              float loss_scale, float* dhidden, float* dweight,
                              Workspace& workspace, const LmHeadChunkObserver& observe = {});

}  // namespace moecore
