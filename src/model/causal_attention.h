// Causal scaled-dot-product attention with grouped-query attention (GQA), matching Hugging Face's
// eager attention: scores = (q k^T) / sqrt(head_dim), causal mask, softmax in fp32, probs @ v.
// Query head h reads kv head h / (n_heads / n_kv_heads), i.e. HF's repeat_kv grouping.
//
// Activation gradients overwrite their outputs (=), they never accumulate (DESIGN.md convention).
#pragma once

#include <cstdint>

namespace moecore {

struct AttentionShape {
  int64_t batch;
  int64_t seq;
  int64_t n_heads;     // query heads
  int64_t n_kv_heads;  // key/value heads; must divide n_heads
  int64_t head_dim;
};

// q: [B, T, n_heads, hd]; k, v: [B, T, n_kv_heads, hd]; out: [B, T, n_heads, hd].
// probs: [B, n_heads, T, T], the softmax saved for the backward; masked entries (key index >
// query index, or before doc_start) are written as 0.
// doc_start: [B, T] or nullptr. When given, query t of row b attends to keys
// [doc_start[b, t], t] only (intra-document masking, model/document_mask.h); nullptr is plain
// causal attention. The backward needs no mask: it reads the exact zeros of probs.
void causal_attention_forward(const AttentionShape& s, const float* q, const float* k,
                              const float* v, float* out, float* probs,
                              const int32_t* doc_start = nullptr);

// dout: [B, T, n_heads, hd]; q, k, v, probs: as given to / produced by the forward.
// dq: [B, T, n_heads, hd]; dk, dv: [B, T, n_kv_heads, hd]; all three are overwritten. dk and dv sum
// the contributions of every query head of their group.
void causal_attention_backward(const AttentionShape& s, const float* dout, const float* q,
                               const float* k, const float* v, const float* probs, float* dq,
                               float* dk, float* dv);

}  // namespace moecore
