// The argument checks of flash_attention_forward / _backward (kernels/op_declarations.inc), shared
// by every backend: shapes, dtypes and the device the views are on. The values of doc_start are
// checked on the host only (check_doc_start_values); a device backend would have to wait for them.
#pragma once

#include <cstdint>

#include "kernels/view_checks.h"

namespace moecore::kernels {

struct FlashAttentionDims {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

// q [B, T, heads, hd], k and v [B, T, kv_heads, hd], doc_start [B, T] i32 or empty.
inline FlashAttentionDims flash_attention_dims(const char* op, ConstTensorView q, ConstTensorView k,
                                               ConstTensorView v, ConstTensorView doc_start,
                                               Device device) {
  MOE_CHECK(q.rank() == 4 && k.rank() == 4,
            "[{}] q and k must be [batch, seq, heads, head_dim], got ranks {} and {}", op, q.rank(),
            k.rank());
  const FlashAttentionDims s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  MOE_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0,
            "[{}] batch={} seq={} heads={} kv_heads={} head_dim={} must all be positive", op,
            s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
  MOE_CHECK(s.heads % s.kv_heads == 0, "[{}] kv_heads={} does not divide heads={}", op, s.kv_heads,
            s.heads);
  expect_shape(op, "q", q, {s.batch, s.seq, s.heads, s.head_dim}, device);
  expect_shape(op, "k", k, {s.batch, s.seq, s.kv_heads, s.head_dim}, device);
  expect_shape(op, "v", v, {s.batch, s.seq, s.kv_heads, s.head_dim}, device);
  if (doc_start.raw() != nullptr) {
    expect_shape(op, "doc_start", doc_start, {s.batch, s.seq}, device);
    MOE_CHECK(doc_start.dtype() == DType::kI32, "[{}] doc_start must be i32, got {}", op,
              dtype_name(doc_start.dtype()));
  }
  return s;
}

// The forward's outputs: out [B, T, heads, hd], lse [B, heads, T].
inline void expect_flash_forward_outputs(const char* op, const FlashAttentionDims& s,
                                         TensorView out, TensorView lse, Device device) {
  expect_shape(op, "out", out, {s.batch, s.seq, s.heads, s.head_dim}, device);
  expect_shape(op, "lse", lse, {s.batch, s.heads, s.seq}, device);
}

// The backward's other views: dout, out, dq [B, T, heads, hd]; lse [B, heads, T]; dk, dv [B, T,
// kv_heads, hd].
inline void expect_flash_backward_views(const char* op, const FlashAttentionDims& s,
                                        ConstTensorView dout, ConstTensorView out,
                                        ConstTensorView lse, TensorView dq, TensorView dk,
                                        TensorView dv, Device device) {
  expect_shape(op, "dout", dout, {s.batch, s.seq, s.heads, s.head_dim}, device);
  expect_shape(op, "out", out, {s.batch, s.seq, s.heads, s.head_dim}, device);
  expect_shape(op, "lse", lse, {s.batch, s.heads, s.seq}, device);
  expect_shape(op, "dq", dq, {s.batch, s.seq, s.heads, s.head_dim}, device);
  expect_shape(op, "dk", dk, {s.batch, s.seq, s.kv_heads, s.head_dim}, device);
  expect_shape(op, "dv", dv, {s.batch, s.seq, s.kv_heads, s.head_dim}, device);
}

// Host doc_start values (null: none): position t of every row starts its document in [0, t], so
// every query attends at least itself.
inline void check_doc_start_values(const char* op, const int32_t* doc_start,
                                   const FlashAttentionDims& s) {
  if (doc_start == nullptr) return;
  for (int64_t i = 0; i < s.batch * s.seq; ++i)
    MOE_CHECK(doc_start[i] >= 0 && doc_start[i] <= i % s.seq,
              "[{}] doc_start={} at (batch {}, position {}) is not in [0, position]", op,
              doc_start[i], i / s.seq, i % s.seq);
}

}  // namespace moecore::kernels
